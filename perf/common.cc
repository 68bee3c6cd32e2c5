// perf/common.cc — the perf harness: nccl-tests' command line, timing loop, data check and table, over loom's
// public API (the check's values and comparison are in check_data.cc). Ranks are the processes of a launcher
// (loomrun, mpirun, torchrun, srun: loomCommInitFromEnv) or, with no launcher, -t threads of this process
// (loomGetUniqueId + loomCommInitRank). Buffers are host memory, or with -D cuda device memory on a CUDA
// communicator (checked through host copies). Written from nccl-tests' documented behaviour; the CUDA-only flags
// loom does not have yet are refused.
#include "perf/common.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "perf/check_data.h"
#include "perf/cli.h"
#include "perf/cuda_buffers.h"
#include "perf/options.h"

namespace perf {
namespace {

// Application code: a failed call ends the program with a message naming the call.
#define PERF_CHECK(comm, call)                                                                  \
  do {                                                                                          \
    loomResult_t perfResult = (call);                                                           \
    if (perfResult != loomSuccess) failLoomCall(#call, __FILE__, __LINE__, perfResult, (comm)); \
  } while (0)

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

[[noreturn]] void failLoomCall(const char* call, const char* file, int line, loomResult_t result, loomComm_t comm) {
  const char* detail = loomGetLastError(comm);
  fprintf(stderr, "%s: Test loom failure %s:%d %s: '%s'%s%s\n", hostName().c_str(), file, line, call,
          loomGetErrorString(result), detail && *detail ? ": " : "", detail ? detail : "");
  fflush(stdout);
  fflush(stderr);
  _exit(1);  // other ranks of this process may be inside loom; do not run destructors under them
}

}  // namespace

CallSizes gatheredSizes(size_t count, size_t eltSize, int nranks) {
  size_t block = perRankCount(count, eltSize, nranks);
  return CallSizes{block, block * nranks, block, block, 0};
}

void fillGatheredInput(void* send, const CheckArgs& a) {
  fillData(send, a.sizes.sendCount, a.type, a.rank, a.rank * a.sizes.sendCount);
}

size_t fillGatheredExpected(void* expected, const CheckArgs& a) {
  fillGathered(expected, a.sizes.sendCount, a.type, a.nranks);
  return a.sizes.recvCount;
}

CallSizes scatteredSizes(size_t count, size_t eltSize, int nranks) {
  size_t block = perRankCount(count, eltSize, nranks);
  return CallSizes{block * nranks, block, block, 0, block};
}

double busBandwidthFactor(Collective collective, int nranks) {
  double n = nranks;
  switch (collective) {
    case Collective::kAllReduce:
      return 2 * (n - 1) / n;  // reduce-scatter then all-gather
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll:
    case Collective::kGather:
    case Collective::kScatter:
      return (n - 1) / n;  // every rank sends or receives all but its own block
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kSendRecv:
      return 1;  // the whole buffer crosses each link once
  }
  return 1;
}

size_t perRankCount(size_t count, size_t eltSize, int nranks) { return (count / nranks) & ~(16 / eltSize - 1); }

namespace {

// ---- the watchdog behind -T ----

// Ends the process when a rank stays in one size's measurement longer than the timeout: a stuck collective
// would otherwise hold the job until loom's own (much longer) deadline.
class Watchdog {
 public:
  Watchdog(int seconds, int slots) : seconds_(seconds), deadlines_(slots) {
    if (seconds_ > 0) thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void arm(int slot, int rank, const std::string& what) {
    if (seconds_ <= 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    deadlines_[slot] = {std::chrono::steady_clock::now() + std::chrono::seconds(seconds_), rank, what, true};
  }
  void disarm(int slot) {
    if (seconds_ <= 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    deadlines_[slot].armed = false;
  }

 private:
  struct Deadline {
    std::chrono::steady_clock::time_point when;
    int rank = 0;
    std::string what;
    bool armed = false;
  };
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; })) {
      for (const Deadline& d : deadlines_) {
        if (!d.armed || std::chrono::steady_clock::now() < d.when) continue;
        fprintf(stderr, "%s: Test timeout (%ds): rank %d is still in %s\n", hostName().c_str(), seconds_, d.rank,
                d.what.c_str());
        fflush(stdout);
        fflush(stderr);
        _exit(1);
      }
    }
  }
  int seconds_;
  std::vector<Deadline> deadlines_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// ---- one rank ----

struct RankInfo {  // what rank 0 prints about every rank; fixed size so that it travels as bytes
  int32_t rank;
  int32_t pid;
  char host[56];
  int32_t device;  // -D cuda: the CUDA device, its PCI bus id and name; else -1
  char busId[20];
  char deviceName[64];
};

// The index of this process among the ranks of its host, as launchers give it; -1 when none does.
int localRankFromEnv() {
  for (const char* name : {"LOOM_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "MPI_LOCALRANKID",
                           "SLURM_LOCALID"})
    if (const char* value = getenv(name)) return atoi(value);
  return -1;
}

// The size column of a row: the larger of the two buffers, as nccl-tests prints it.
struct Row {
  CallSizes sizes;
  size_t eltSize;
  size_t bytes() const { return std::max(sizes.sendCount, sizes.recvCount) * eltSize; }
};

// One placement (out of place or in place) of one row, as measured.
struct Half {
  bool measured = false;
  double timeUs = 0, algBw = 0, busBw = 0;
  int64_t wrong = 0;
  std::vector<double> iterUs;  // -I: this rank's time of every iteration
};

struct RowResult {
  size_t bytes, count;
  int type, op, root;
  Half outOfPlace, inPlace;
};

double secondsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class RankRunner {
 public:
  RankRunner(const Options& options, const CollectiveTest& test, Watchdog& watchdog, int watchdogSlot)
      : o_(options), test_(test), watchdog_(watchdog), watchdogSlot_(watchdogSlot), maxBytes_(options.maxBytes) {}

  void initFromEnv() {
    PERF_CHECK(nullptr, loomCommInitFromEnv(&control_));
    finishInit(localRankFromEnv());
  }
  void initRank(const loomUniqueId& id, int nranks, int rank) {
    PERF_CHECK(nullptr, loomCommInitRank(&control_, nranks, id, rank));
    finishInit(rank);
  }
  // Runs every row; returns the number of failed checks over all ranks.
  int64_t run(const char* programName);

 private:
  // The harness's own messages (barriers, the time and the check's verdicts) go over `control_`, a host
  // communicator; the timed calls over `comm_`, the same one on host or a CUDA communicator split from it.
  void finishInit(int localRank) {
    PERF_CHECK(control_, loomCommUserRank(control_, &rank_));
    PERF_CHECK(control_, loomCommCount(control_, &nranks_));
    printer_ = rank_ == 0;
    comm_ = control_;
    if (!o_.cuda) return;
    cudaDevice_ = (localRank >= 0 ? localRank : rank_) % std::max(cuda::deviceCount(), 1);
    if (!cuda::select(cudaDevice_, &deviceName_, &busId_)) failCuda("selecting device " + std::to_string(cudaDevice_));
    loomConfig_t config = LOOM_CONFIG_INITIALIZER;
    config.device = loomDeviceCuda;
    config.cudaDevice = cudaDevice_;
    PERF_CHECK(control_, loomCommSplit(control_, 0, rank_, &comm_, &config));
  }
  [[noreturn]] void failCuda(const std::string& what) const {
    fprintf(stderr, "%s: rank %d: CUDA failure %s: %s\n", hostName().c_str(), rank_, what.c_str(),
            cuda::lastError().c_str());
    fflush(stdout);
    _exit(1);
  }
  bool checkActive() const { return o_.check > 0; }
  void barrier() { PERF_CHECK(control_, loomBarrier(control_, nullptr)); }
  void complete() {
    if (o_.cuda) {
      if (!cuda::synchronize(stream_)) failCuda("synchronizing the stream");
      loomResult_t queued = loomSuccess;
      PERF_CHECK(comm_, loomCommGetAsyncError(comm_, &queued));
      if (queued != loomSuccess) failLoomCall("a call queued on the stream", __FILE__, __LINE__, queued, comm_);
      return;
    }
    if (stream_) PERF_CHECK(comm_, loomStreamSynchronize(stream_));
  }
  template <typename T>
  T allReduce(T value, loomDataType_t type, loomRedOp_t op) {
    PERF_CHECK(control_, loomAllReduce(&value, &value, 1, type, op, control_, nullptr));
    return value;
  }
  // -D cuda: the host copy of the device buffer that holds `pointer`, at the same offset; on host, pointer.
  char* hostView(char* pointer) {
    if (!o_.cuda) return pointer;
    if (pointer >= send_ && pointer < send_ + bufferBytes_) return sendMirror_.data() + (pointer - send_);
    return recvMirror_.data() + (pointer - recv_);
  }
  // The bytes at the start of each buffer a row touches (offsets, in-place placement and -u included).
  size_t regionBytes(const Row& row) const {
    return std::min(bufferBytes_, 2 * row.bytes() + 4 * o_.unalign * sizeof(double) + 64);
  }
  void upload(const Row& row) {
    if (o_.cuda && !(cuda::copy(send_, sendMirror_.data(), regionBytes(row), stream_) &&
                     cuda::copy(recv_, recvMirror_.data(), regionBytes(row), stream_)))
      failCuda("copying the inputs to the device");
  }
  void download(const Row& row) {
    if (o_.cuda && !cuda::copy(recvMirror_.data(), recv_, regionBytes(row), stream_))
      failCuda("copying the results back");
  }
  std::vector<RankInfo> gatherRankInfo();
  void limitMaxBytes(const std::vector<RankInfo>& ranks);
  void printHeader(const char* programName, const std::vector<RankInfo>& ranks);
  void allocate();
  void release();
  char* inputOf(const Row& row, bool inPlace, size_t shift) const;
  char* outputOf(const Row& row, bool inPlace, size_t shift) const;
  void startCall(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace, int iter);
  void afterCalls();
  int64_t checkOnce(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace);
  Half measure(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace);
  std::string cells(const Half& half) const;
  void reportMemory();
  bool writeJson(const char* programName, int64_t failed, double avgBusBw) const;
  void sweep(loomDataType_t type, loomRedOp_t op, int root);
  // What a rank is doing, for the watchdog's message.
  std::string describe(const Row& row, loomDataType_t type, const char* phase) const {
    return std::string(phase) + test_.name + " " + kTypeNames[type] + " " + std::to_string(row.bytes()) + " bytes";
  }
  // The size after `size`; a sweep by factor that starts at 0 goes on at one element.
  size_t nextSize(size_t size, int factor, size_t eltSize) const {
    if (factor <= 1) return size + o_.stepBytes;
    return size == 0 ? eltSize : size * factor;
  }

  const Options& o_;
  const CollectiveTest& test_;
  Watchdog& watchdog_;
  const int watchdogSlot_;
  size_t maxBytes_;
  loomComm_t control_ = nullptr;
  loomComm_t comm_ = nullptr;
  loomStream_t stream_ = nullptr;  // a host stream, or a cudaStream_t with -D cuda
  int cudaDevice_ = -1;
  std::string deviceName_, busId_;
  std::vector<char> sendMirror_, recvMirror_;  // -D cuda: host copies of the buffers, for the check
  int rank_ = 0, nranks_ = 1;
  bool printer_ = false;
  size_t bufferBytes_ = 0;
  char* send_ = nullptr;
  char* recv_ = nullptr;
  std::vector<char> expected_;
  void* sendHandle_ = nullptr;
  void* recvHandle_ = nullptr;
  double busBwSum_ = 0;
  int busBwCount_ = 0;
  int64_t failedChecks_ = 0;        // rows (and placements) where this rank's output was wrong
  std::vector<RowResult> results_;  // every row, for -J
};

std::vector<RankInfo> RankRunner::gatherRankInfo() {
  RankInfo mine{};
  mine.rank = rank_;
  mine.pid = static_cast<int32_t>(getpid());
  snprintf(mine.host, sizeof(mine.host), "%s", hostName().c_str());
  mine.device = cudaDevice_;
  snprintf(mine.busId, sizeof(mine.busId), "%s", busId_.c_str());
  snprintf(mine.deviceName, sizeof(mine.deviceName), "%s", deviceName_.c_str());
  std::vector<RankInfo> all(nranks_);
  PERF_CHECK(control_, loomAllGather(&mine, all.data(), sizeof(RankInfo), loomUint8, control_, nullptr));
  return all;
}

// Like nccl-tests, shrink -e when the buffers of all ranks on a host would not fit in its memory.
void RankRunner::limitMaxBytes(const std::vector<RankInfo>& ranks) {
  const uint64_t kGiB = 1ull << 30;
  uint64_t memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t reserve = std::min((memory + 16 * kGiB - 1) / (16 * kGiB) * kGiB, 4 * kGiB) + kGiB;
  uint64_t ranksHere = std::count_if(ranks.begin(), ranks.end(),
                                     [&](const RankInfo& r) { return strcmp(r.host, ranks[rank_].host) == 0; });
  uint64_t limit = memory > reserve ? (memory - reserve) / (checkActive() ? 3 : 2) / ranksHere : 0;
  if (o_.cuda) {
    // The device buffers, from the device's free memory shared by the ranks on it; the host holds the copies.
    uint64_t ranksOnDevice = std::count_if(ranks.begin(), ranks.end(), [&](const RankInfo& r) {
      return strcmp(r.host, ranks[rank_].host) == 0 && strcmp(r.busId, ranks[rank_].busId) == 0;
    });
    limit = std::min<uint64_t>(limit, cuda::freeBytes() / 10 * 9 / 2 / ranksOnDevice);
  }
  limit = allReduce<uint64_t>(limit, loomUint64, loomMin);
  if (maxBytes_ > limit) {
    maxBytes_ = limit;
    if (printer_) printf("#\n# Reducing maxBytes to %zu due to memory limitation\n", maxBytes_);
  }
}

void RankRunner::printHeader(const char* programName, const std::vector<RankInfo>& ranks) {
  int version = 0;
  loomGetVersion(&version);
  printf("# loom perf version %d.%d.%d loom-headers=%d loom-library=%d\n", LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH,
         LOOM_VERSION_CODE, version);
  printf("# Collective test starting: %s\n", programName);
  printf(
      "# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
      "validation: %d graph: 0\n",
      o_.nThreads, o_.minBytes, o_.maxBytes, o_.stepFactor > 1 ? static_cast<size_t>(o_.stepFactor) : o_.stepBytes,
      o_.stepFactor > 1 ? "factor" : "bytes", o_.warmupIters, o_.iters, o_.aggIters, o_.check);
  if (o_.blocking == 1) printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
  if (o_.blocking == 2) printf("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n");
  if (o_.blocking == 3)
    printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier \n");
  if (o_.parallelInit) printf("# Parallel Init Enabled: threads call into loomCommInitRank concurrently \n");
  printf("#\n# Using devices\n");
  for (const RankInfo& r : ranks) {
    // The device number of a host rank: its place among the ranks on its host, as a GPU's would be.
    long device = std::count_if(ranks.begin(), ranks.begin() + r.rank,
                                [&](const RankInfo& other) { return strcmp(other.host, r.host) == 0; });
    if (r.device >= 0) {
      printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s\n", r.rank, r.pid, r.host, r.device, r.busId,
             r.deviceName);
    } else {
      printf("#  Rank %2d Group  0 Pid %6d on %10s device %2ld [cpu] host\n", r.rank, r.pid, r.host, device);
    }
  }
}

void RankRunner::allocate() {
  bufferBytes_ = std::max<size_t>(maxBytes_, 64) + 4 * o_.unalign * sizeof(double);  // -u room; never 0 bytes
  if (checkActive()) expected_.resize(bufferBytes_);
  if (o_.cuda) {
    send_ = static_cast<char*>(cuda::allocate(bufferBytes_));
    recv_ = static_cast<char*>(cuda::allocate(bufferBytes_));
    if (send_ == nullptr || recv_ == nullptr || !cuda::zero(send_, bufferBytes_) || !cuda::zero(recv_, bufferBytes_))
      failCuda("allocating two buffers of " + std::to_string(bufferBytes_) + " bytes");
    sendMirror_.assign(bufferBytes_, 0);
    recvMirror_.assign(bufferBytes_, 0);
    if (!o_.streamNull && (stream_ = cuda::createStream()) == nullptr) failCuda("creating a stream");
    return;
  }
  PERF_CHECK(comm_, loomMemAlloc(reinterpret_cast<void**>(&send_), bufferBytes_));
  PERF_CHECK(comm_, loomMemAlloc(reinterpret_cast<void**>(&recv_), bufferBytes_));
  // Touch every page once, as an application's buffers would be, so the first row does not time page faults.
  memset(send_, 0, bufferBytes_);
  memset(recv_, 0, bufferBytes_);
  if (o_.localRegister) {
    PERF_CHECK(comm_, loomCommRegister(comm_, send_, bufferBytes_, &sendHandle_));
    PERF_CHECK(comm_, loomCommRegister(comm_, recv_, bufferBytes_, &recvHandle_));
  }
  if (!o_.streamNull) PERF_CHECK(comm_, loomStreamCreate(&stream_));
}

void RankRunner::release() {
  if (o_.cuda) {
    if (stream_) cuda::destroyStream(stream_);
    cuda::release(send_);
    cuda::release(recv_);
    PERF_CHECK(nullptr, loomCommDestroy(comm_));
    PERF_CHECK(nullptr, loomCommDestroy(control_));
    return;
  }
  if (stream_) PERF_CHECK(comm_, loomStreamDestroy(stream_));
  if (sendHandle_) PERF_CHECK(comm_, loomCommDeregister(comm_, sendHandle_));
  if (recvHandle_) PERF_CHECK(comm_, loomCommDeregister(comm_, recvHandle_));
  PERF_CHECK(comm_, loomMemFree(send_));
  PERF_CHECK(comm_, loomMemFree(recv_));
  PERF_CHECK(nullptr, loomCommDestroy(comm_));
}

// In place, the input lives inside the receive buffer, at the place the collective's in-place form names.
// -u moves both off their alignment, by different amounts so that they are not aligned with each other either.
char* RankRunner::inputOf(const Row& row, bool inPlace, size_t shift) const {
  if (!inPlace) return send_ + shift + o_.unalign * row.eltSize;
  return outputOf(row, false, shift) + row.sizes.sendInPlaceOffset * rank_ * row.eltSize;
}
char* RankRunner::outputOf(const Row& row, bool inPlace, size_t shift) const {
  return recv_ + shift + 3 * o_.unalign * row.eltSize +
         (inPlace ? row.sizes.recvInPlaceOffset * rank_ * row.eltSize : 0);
}

void RankRunner::startCall(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace, int iter) {
  // Successive iterations walk through the buffers (as nccl-tests does), so small sizes are not timed from a
  // cache that a real application would not have warmed.
  size_t bytes = row.bytes();
  size_t steps = bytes ? std::max<size_t>(maxBytes_ / bytes, 1) : 1;
  size_t shift = bytes * (iter % steps);
  CallArgs args{inputOf(row, inPlace, shift),
                outputOf(row, inPlace, shift),
                row.sizes.paramCount,
                type,
                op,
                root,
                rank_,
                nranks_,
                comm_,
                stream_};
  PERF_CHECK(comm_, test_.run(args));
  if (o_.blocking && o_.aggIters <= 1) afterCalls();
}

// -z 1 and 2: wait for the call (-z 1 also lines ranks up). With -m > 1 this follows the group, since waiting
// inside a group would wait for calls not yet issued.
void RankRunner::afterCalls() {
  if (o_.blocking == 1 || o_.blocking == 2) complete();
  if (o_.blocking == 1) barrier();
}

int64_t RankRunner::checkOnce(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace) {
  // Poison the output first, so an unwritten element counts.
  fillPoison(hostView(outputOf(row, false, 0)), row.sizes.recvCount, type);
  CheckArgs args{row.sizes, type, op, root, rank_, nranks_};
  test_.fillInput(hostView(inputOf(row, inPlace, 0)), args);
  upload(row);
  size_t checked = test_.fillExpected(expected_.data(), args);
  startCall(row, type, op, root, inPlace, 0);
  complete();
  download(row);
  double tolerance = test_.hasOp ? reduceTolerance(type, op, nranks_) : 0;
  return countWrong(hostView(outputOf(row, inPlace, 0)), expected_.data(), checked, type, tolerance);
}

// One half of a row: time iters calls, and check.
Half RankRunner::measure(const Row& row, loomDataType_t type, loomRedOp_t op, int root, bool inPlace) {
  watchdog_.arm(watchdogSlot_, rank_, describe(row, type, ""));
  if (checkActive()) {  // defined input for the timed calls too: no denormals, no NaN
    CheckArgs args{row.sizes, type, op, root, rank_, nranks_};
    test_.fillInput(hostView(inputOf(row, inPlace, 0)), args);
    upload(row);
  }
  startCall(row, type, op, root, inPlace, 0);
  complete();
  barrier();

  const int calls = o_.iters * o_.aggIters;
  Half half;
  half.measured = true;
  double start = secondsNow(), outsideBarriers = 0;
  for (int iter = 0; iter < o_.iters; iter++) {
    // The clock only when an iteration is timed on its own (-z 3, -I): a read costs as much as a small call.
    double iterStart = o_.blocking == 3 || o_.perIterTiming ? secondsNow() : 0;
    if (o_.aggIters > 1) PERF_CHECK(comm_, loomGroupStart());
    for (int a = 0; a < o_.aggIters; a++) startCall(row, type, op, root, inPlace, iter * o_.aggIters + a);
    if (o_.aggIters > 1) {
      PERF_CHECK(comm_, loomGroupEnd());
      if (o_.blocking) afterCalls();
    }
    if (o_.blocking == 3) {
      complete();
      outsideBarriers += secondsNow() - iterStart;
      barrier();
    } else if (o_.perIterTiming) {
      complete();
      half.iterUs.push_back((secondsNow() - iterStart) * 1e6 / o_.aggIters);
    }
  }
  double cpuSeconds = (o_.blocking == 3 ? outsideBarriers : secondsNow() - start) / calls;
  complete();
  double seconds = (o_.blocking == 3 ? outsideBarriers : secondsNow() - start) / calls;
  if (!half.iterUs.empty()) {  // -I: the median iteration, which one slow iteration does not move
    std::vector<double> sorted = half.iterUs;
    std::sort(sorted.begin(), sorted.end());
    seconds = sorted[sorted.size() / 2] / 1e6;
  }

  if (o_.average == 1) seconds = allReduce(seconds, loomFloat64, loomSum) / nranks_;
  if (o_.average == 2) seconds = allReduce(seconds, loomFloat64, loomMin);
  if (o_.average == 3) seconds = allReduce(seconds, loomFloat64, loomMax);
  double algBw = seconds > 0 ? static_cast<double>(row.bytes()) / 1e9 / seconds : 0;
  double busBw = algBw * busBandwidthFactor(test_.collective, nranks_);
  barrier();

  int64_t wrong = 0;
  for (int c = 0; c < o_.check; c++) {
    int64_t mine = checkOnce(row, type, op, root, inPlace);
    if (mine) failedChecks_++;
    wrong = allReduce<int64_t>(mine, loomInt64, loomSum);
    if (wrong) break;
  }
  watchdog_.disarm(watchdogSlot_);
  busBwSum_ += busBw;
  busBwCount_++;

  half.timeUs = (o_.reportCpuTime ? cpuSeconds : seconds) * 1e6;
  half.algBw = algBw;
  half.busBw = busBw;
  half.wrong = wrong;
  return half;
}

std::string RankRunner::cells(const Half& half) const {
  if (!half.measured) return "      N/A     N/A     N/A     N/A";
  char wrongCell[32];
  if (checkActive()) {
    snprintf(wrongCell, sizeof(wrongCell), "%6g", static_cast<double>(half.wrong));
  } else {
    snprintf(wrongCell, sizeof(wrongCell), "   N/A");
  }
  return "  " + formatCell(half.timeUs, 7) + "  " + formatCell(half.algBw, 6) + "  " + formatCell(half.busBw, 6) +
         "  " + wrongCell;
}

void RankRunner::sweep(loomDataType_t type, loomRedOp_t op, int root) {
  const size_t eltSize = typeSize(type);
  auto rowFor = [&](size_t bytes) { return Row{test_.sizes(bytes / eltSize, eltSize, nranks_), eltSize}; };
  barrier();
  for (size_t size = o_.minBytes; size <= maxBytes_; size = nextSize(size, 2, eltSize)) {  // warm every size up
    Row row = rowFor(size);
    watchdog_.arm(watchdogSlot_, rank_, describe(row, type, "the warm-up of "));
    for (int iter = 0; iter < o_.warmupIters; iter++) startCall(row, type, op, root, false, iter);
    complete();
    watchdog_.disarm(watchdogSlot_);
  }
  for (int cycle = 0; o_.runCycles == 0 || cycle < o_.runCycles; cycle++) {
    for (size_t size = o_.minBytes; size <= maxBytes_; size = nextSize(size, o_.stepFactor, eltSize)) {
      Row row = rowFor(size);
      char preamble[128];
      snprintf(preamble, sizeof(preamble), "%12zu  %12zu  %8s  %6s  %6d", row.bytes(), row.sizes.paramCount,
               kTypeNames[type], test_.hasOp ? kOpNames[op] : "none", test_.hasRoot ? root : -1);
      RowResult result{row.bytes(), row.sizes.paramCount, type, test_.hasOp ? op : -1, test_.hasRoot ? root : -1, {},
                       {}};
      result.outOfPlace = measure(row, type, op, root, false);
      if (test_.hasInPlace) result.inPlace = measure(row, type, op, root, true);
      if (!printer_) continue;
      printf("%s%s%s\n", preamble, cells(result.outOfPlace).c_str(), cells(result.inPlace).c_str());
      if (o_.perIterTiming) {
        std::string spread = "#  per-iteration time (us), rank 0, min/median/max:";
        for (const Half* half : {&result.outOfPlace, &result.inPlace}) {
          if (!half->measured || half->iterUs.empty()) continue;
          std::vector<double> sorted = half->iterUs;
          std::sort(sorted.begin(), sorted.end());
          char text[96];
          snprintf(text, sizeof(text), "  %s %.2f/%.2f/%.2f", half == &result.inPlace ? "in place" : "out of place",
                   sorted.front(), sorted[sorted.size() / 2], sorted.back());
          spread += text;
        }
        printf("%s\n", spread.c_str());
      }
      if (!o_.jsonFile.empty()) results_.push_back(std::move(result));
    }
  }
}

// -M: what this run held: the perf buffers, and the process's resident set now and at its peak (which includes
// loom's FIFOs and scratch space), the largest over ranks.
void RankRunner::reportMemory() {
  auto statusKiB = [](const char* field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    size_t length = strlen(field);
    while (std::getline(status, line))
      if (line.compare(0, length, field) == 0) return std::strtod(line.c_str() + length + 1, nullptr);
    return 0.0;
  };
  double buffersMiB = (2.0 * bufferBytes_ + expected_.size()) / (1 << 20);
  double residentMiB = allReduce(statusKiB("VmRSS") / 1024, loomFloat64, loomMax);
  double peakMiB = allReduce(statusKiB("VmHWM") / 1024, loomFloat64, loomMax);
  if (printer_)
    printf(
        "# Memory: %.1f MiB of buffers per rank (send, receive, check); process resident %.1f MiB, peak %.1f MiB "
        "(largest over ranks)\n",
        buffersMiB, residentMiB, peakMiB);
}

// -J: the run as one JSON object; rank 0 writes it.
bool RankRunner::writeJson(const char* programName, int64_t failed, double avgBusBw) const {
  std::ofstream out(o_.jsonFile);
  if (!out) {
    fprintf(stderr, "cannot write %s: %s\n", o_.jsonFile.c_str(), strerror(errno));
    return false;
  }
  // JSON strings: quotes and backslashes escaped, control characters as \u00XX, bytes that are not ASCII as
  // \u00XX too (a command line need not be UTF-8), so the file always parses.
  auto quoted = [](const std::string& text) {
    std::string q = "\"";
    for (char c : text) {
      auto byte = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (byte < 0x20 || byte >= 0x80) {
        char escaped[8];
        snprintf(escaped, sizeof(escaped), "\\u%04x", byte);
        q += escaped;
      } else {
        q += c;
      }
    }
    return q + "\"";
  };
  auto half = [&](const Half& h) {
    if (!h.measured) return std::string("null");
    char text[160];
    snprintf(text, sizeof(text), "{\"time_us\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"wrong\": %lld",
             h.timeUs, h.algBw, h.busBw, checkActive() ? static_cast<long long>(h.wrong) : -1LL);
    std::string json = text;
    if (!h.iterUs.empty()) {
      json += ", \"iteration_us\": [";
      for (size_t i = 0; i < h.iterUs.size(); i++) json += (i ? ", " : "") + std::to_string(h.iterUs[i]);
      json += "]";
    }
    return json + "}";
  };
  out << "{\n  \"program\": " << quoted(programName) << ",\n  \"command\": " << quoted(o_.commandLine)
      << ",\n  \"host\": " << quoted(hostName()) << ",\n  \"nranks\": " << nranks_ << ",\n  \"loom_version\": \""
      << LOOM_MAJOR << "." << LOOM_MINOR << "." << LOOM_PATCH << "\""
      << ",\n  \"iters\": " << o_.iters << ",\n  \"agg_iters\": " << o_.aggIters << ",\n  \"average\": " << o_.average
      << ",\n  \"rows\": [";
  for (size_t i = 0; i < results_.size(); i++) {
    const RowResult& r = results_[i];
    out << (i ? ",\n" : "\n") << "    {\"size\": " << r.bytes << ", \"count\": " << r.count
        << ", \"type\": " << quoted(kTypeNames[r.type])
        << ", \"redop\": " << quoted(r.op >= 0 ? kOpNames[r.op] : "none") << ", \"root\": " << r.root
        << ", \"out_of_place\": " << half(r.outOfPlace) << ", \"in_place\": " << half(r.inPlace) << "}";
  }
  out << "\n  ],\n  \"out_of_bounds\": " << failed << ",\n  \"avg_busbw_gbps\": " << avgBusBw << "\n}\n";
  out.flush();
  if (!out) fprintf(stderr, "cannot write %s: %s\n", o_.jsonFile.c_str(), strerror(errno));
  return static_cast<bool>(out);
}

int64_t RankRunner::run(const char* programName) {
  std::vector<RankInfo> ranks = gatherRankInfo();
  if (printer_) printHeader(programName, ranks);
  limitMaxBytes(ranks);
  if (test_.hasRoot && o_.root >= nranks_) {  // every rank sees this, so every rank leaves
    if (printer_) fprintf(stderr, "invalid root %d for %d ranks (see -h)\n", o_.root, nranks_);
    fflush(stdout);
    _exit(2);
  }
  allocate();
  if (printer_) {
    const char* time = o_.reportCpuTime ? "cputime" : "time";
    printf("#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "",
           "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop",
           "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "",
           "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  // The values a loop takes: `chosen`, or all `count` of them for "all" (-1), or just 0 where it does not apply.
  auto range = [](bool applies, int chosen, int count) {
    return !applies ? std::pair{0, 0} : chosen < 0 ? std::pair{0, count - 1} : std::pair{chosen, chosen};
  };
  auto [firstType, lastType] = range(true, o_.type, loomNumTypes);
  auto [firstOp, lastOp] = range(test_.hasOp, o_.op, loomNumOps);
  auto [firstRoot, lastRoot] = range(test_.hasRoot, o_.root, nranks_);
  for (int type = firstType; type <= lastType; type++) {
    for (int op = firstOp; op <= lastOp; op++) {
      for (int root = firstRoot; root <= lastRoot; root++) {
        sweep(static_cast<loomDataType_t>(type), static_cast<loomRedOp_t>(op), root);
      }
    }
  }
  int64_t failed = allReduce<int64_t>(failedChecks_, loomInt64, loomSum);
  if (printer_) {
    double avgBusBw = busBwCount_ ? busBwSum_ / busBwCount_ : 0;
    printf("# %-20s : %lld %s\n", "Out of bounds values", static_cast<long long>(failed), failed ? "FAILED" : "OK");
    printf("# %-20s : %g \n", "Avg bus bandwidth", avgBusBw);
  }
  if (o_.memoryReport) reportMemory();
  if (printer_) {
    // A results file that could not be written fails the run as a wrong result would.
    if (!o_.jsonFile.empty() && !writeJson(programName, failed, busBwCount_ ? busBwSum_ / busBwCount_ : 0)) ++failed;
    printf("#\n# Collective test concluded: %s\n#\n", programName);
  }
  release();
  return failed;
}

}  // namespace

int runPerfTest(int argc, char** argv, const CollectiveTest& test) {
  setlinebuf(stdout);
  const char* slash = strrchr(argv[0], '/');
  const char* programName = slash ? slash + 1 : argv[0];
  Options options;
  try {
    options = parseOptions(argc, argv);
  } catch (const UsageError& error) {  // a flag's value (perf/cli.h); other mistakes end in usageError at once
    usageError(error.what());
  }
  if (test.ordersItsGroups && options.aggIters > 1)
    usageError(std::string("-m ") + std::to_string(options.aggIters) + ": " + programName +
               "'s call is a sequence of groups, which one enclosing group would merge; run it with -m 1");

  int64_t failed = 0;
  if (underLauncher()) {
    if (options.nThreads > 1) {
      usageError("-t " + std::to_string(options.nThreads) +
                 ": under a launcher each process is one rank; start more processes instead (loomrun -n)");
    }
    Watchdog watchdog(options.timeoutSeconds, 1);
    RankRunner runner(options, test, watchdog, 0);
    runner.initFromEnv();
    failed = runner.run(programName);
  } else {
    // One process, -t ranks: each thread joins the communicator as one rank.
    loomUniqueId id;
    PERF_CHECK(nullptr, loomGetUniqueId(&id));
    Watchdog watchdog(options.timeoutSeconds, options.nThreads);
    std::vector<int64_t> failedPerThread(options.nThreads, 0);
    auto rankMain = [&](int t) {
      RankRunner runner(options, test, watchdog, t);
      runner.initRank(id, options.nThreads, t);
      failedPerThread[t] = runner.run(programName);
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < options.nThreads; t++) threads.emplace_back(rankMain, t);
    rankMain(0);
    for (std::thread& thread : threads) thread.join();
    failed = failedPerThread[0];
  }
  const char* lastError = loomGetLastError(nullptr);
  if (lastError && *lastError) printf("# error: %s\n", lastError);
  return failed ? 1 : 0;
}

}  // namespace perf
