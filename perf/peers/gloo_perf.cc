// gloo_perf: loom's perf table for Gloo's collectives (Debian's libgloo-dev) over Gloo's TCP transport on
// 127.0.0.1, so that tools/compare-peers can set Gloo beside loom: `loomrun -n 2 gloo_perf -C all_reduce ...`.
// Ranks come from the launcher's environment (loomrun's LOOM_RANK/LOOM_NRANKS, torchrun's RANK/WORLD_SIZE or
// Open MPI's); they meet through a gloo::rendezvous::FileStore in $GLOO_PERF_STORE_DIR (default
// $TMPDIR/gloo_perf_store, /tmp without TMPDIR), under a prefix naming the job, and remove their keys once
// connected. Calls: gloo::allreduce, gloo::allgather, gloo::broadcast, gloo::alltoall, and for ReduceScatter
// the one Gloo has, ReduceScatterHalvingDoubling: it reduces in place in the send buffer, so the rank's block
// is copied to the receive buffer after it (timed: it is what a user wanting loom's out-of-place call must do).
// That algorithm races with itself on large buffers (perf/README.md, "Known Gloo bug"): the wrong elements it
// then returns are reported as such. No bfloat16 and no avg in Gloo. It links loom only for the check data.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "perf/peers/peer_harness.h"

namespace {

// Calls body.operator()<T>() with the element type Gloo uses for `type`; false when Gloo has none.
template <typename Body>
bool withGlooType(loomDataType_t type, Body&& body) {
  switch (type) {
    case loomInt8:
      body.template operator()<int8_t>();
      return true;
    case loomUint8:
      body.template operator()<uint8_t>();
      return true;
    case loomInt32:
      body.template operator()<int32_t>();
      return true;
    case loomUint32:
      body.template operator()<uint32_t>();
      return true;
    case loomInt64:
      body.template operator()<int64_t>();
      return true;
    case loomUint64:
      body.template operator()<uint64_t>();
      return true;
    case loomFloat16:
      body.template operator()<gloo::float16>();  // IEEE binary16, the bits loom's check data writes
      return true;
    case loomFloat32:
      body.template operator()<float>();
      return true;
    case loomFloat64:
      body.template operator()<double>();
      return true;
    default:
      return false;
  }
}

// The element-wise function of the new-style calls (AllreduceOptions) for `op`.
template <typename T>
gloo::AllreduceOptions::Func reduceFunction(loomRedOp_t op) {
  using Function = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case loomProd:
      return static_cast<Function>(&gloo::product<T>);
    case loomMax:
      return static_cast<Function>(&gloo::max<T>);
    case loomMin:
      return static_cast<Function>(&gloo::min<T>);
    default:
      return static_cast<Function>(&gloo::sum<T>);
  }
}

// The same for the old-style algorithm objects (ReduceScatterHalvingDoubling).
template <typename T>
const gloo::ReductionFunction<T>* reductionFunction(loomRedOp_t op) {
  switch (op) {
    case loomProd:
      return gloo::ReductionFunction<T>::product;
    case loomMax:
      return gloo::ReductionFunction<T>::max;
    case loomMin:
      return gloo::ReductionFunction<T>::min;
    default:
      return gloo::ReductionFunction<T>::sum;
  }
}

// The first of `names` set in the environment, as an int; `fallback` when none is.
int intFromEnv(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    if (const char* value = getenv(name)) return atoi(value);
  }
  return fallback;
}

// Names this job among jobs that share the store directory: ranks of one job share their launcher (parent
// process) and its root address, and key files of a job that crashed before removing them are never read
// again.
std::string jobPrefix() {
  std::string prefix = "gloo_perf-" + std::to_string(getppid());
  for (const char* name : {"LOOM_ROOT_ADDR", "MASTER_PORT", "OMPI_MCA_orte_hnp_uri"}) {
    if (const char* value = getenv(name)) return prefix + "-" + value;
  }
  return prefix;
}

std::string storeDirectory() {
  if (const char* dir = getenv("GLOO_PERF_STORE_DIR")) return dir;
  const char* tmp = getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/gloo_perf_store";
}

class GlooBackend : public perf::PeerBackend {
 public:
  GlooBackend(int rank, int nranks) {
    std::string directory = storeDirectory();
    std::error_code error;
    std::filesystem::create_directories(directory, error);  // FileStore needs it; a failure shows in connect
    gloo::rendezvous::FileStore files(directory);
    gloo::rendezvous::PrefixStore store(jobPrefix(), files);
    gloo::transport::tcp::attr loopback("127.0.0.1");
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(loopback);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    // Gloo's default timeout (30 s) is shorter than a large call on an oversubscribed host may take.
    context_->setTimeout(std::chrono::minutes(10));
    context_->connectFullMesh(store, device);
    barrier();  // every rank has read every address: this rank's keys can go
    for (const std::string& path : files.getAllKeyFilePaths()) unlink(path.c_str());
  }

  std::string description() const override {
    return "Gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
           std::to_string(GLOO_VERSION_PATCH) + " (Debian libgloo-dev), TCP transport on loopback";
  }
  int rank() const override { return context_->rank; }
  int nranks() const override { return context_->size; }

  std::string unsupported(perf::Collective collective, loomDataType_t type, loomRedOp_t op) const override {
    if (!withGlooType(type, []<typename T>() {})) return "Gloo has no bfloat16 type";
    bool reduces = collective == perf::Collective::kAllReduce || collective == perf::Collective::kReduceScatter;
    if (reduces && op == loomAvg) return "Gloo has no avg operator";
    return "";
  }

  void run(const perf::PeerCall& call) override {
    // Empty calls return at once, as loom's do: Gloo's allgather divides by the element count.
    if (call.count == 0) return;
    withGlooType(call.type, [&]<typename T>() { runTyped<T>(call); });
  }

  void prepare(const perf::PeerCall& call) override {
    if (call.count == 0 || call.collective != perf::Collective::kReduceScatter) return;
    withGlooType(call.type, [&]<typename T>() { reduceScatterFor<T>(call); });
  }

  void startRow() override { reduceScatters_.clear(); }

  void barrier() override {
    gloo::BarrierOptions options(context_);
    gloo::barrier(options);
  }

  double sumOverRanks(double value) override {
    double sum = 0;
    gloo::AllreduceOptions options(context_);
    options.setInput(&value, 1);
    options.setOutput(&sum, 1);
    options.setReduceFunction(reduceFunction<double>(loomSum));
    gloo::allreduce(options);
    return sum;
  }

 private:
  template <typename T>
  void runTyped(const perf::PeerCall& c) {
    // Gloo's buffers are not const; it reads the inputs only (ReduceScatter aside, see reduceScatterFor).
    T* send = static_cast<T*>(const_cast<void*>(c.send));
    T* recv = static_cast<T*>(c.recv);
    switch (c.collective) {
      case perf::Collective::kAllReduce: {
        gloo::AllreduceOptions options(context_);
        options.setInput(send, c.count);
        options.setOutput(recv, c.count);
        options.setReduceFunction(reduceFunction<T>(c.op));
        gloo::allreduce(options);
        break;
      }
      case perf::Collective::kReduceScatter:
        reduceScatterFor<T>(c).run();
        memcpy(c.recv, c.send, c.count * sizeof(T));
        break;
      case perf::Collective::kAllGather: {
        gloo::AllgatherOptions options(context_);
        options.setInput(send, c.sendCount);
        options.setOutput(recv, c.recvCount);
        gloo::allgather(options);
        break;
      }
      case perf::Collective::kBroadcast: {
        gloo::BroadcastOptions options(context_);
        if (context_->rank == c.root) options.setInput(send, c.count);
        options.setOutput(recv, c.count);
        options.setRoot(c.root);
        gloo::broadcast(options);
        break;
      }
      case perf::Collective::kAllToAll: {
        gloo::AlltoallOptions options(context_);
        options.setInput(send, c.sendCount);
        options.setOutput(recv, c.recvCount);
        gloo::alltoall(options);
        break;
      }
      default:
        throw std::runtime_error("gloo_perf: collective not implemented");
    }
  }

  // Gloo's ReduceScatter is an object bound to its buffer, reducing in it: the result of rank r lands at the
  // start of the send buffer. Built once per buffer position (prepare, untimed) and run many times, its
  // intended use; dropped when the row changes.
  template <typename T>
  gloo::Algorithm& reduceScatterFor(const perf::PeerCall& c) {
    if (c.sendCount > INT_MAX / sizeof(T)) throw std::runtime_error("Gloo's ReduceScatter counts bytes in an int");
    std::unique_ptr<gloo::Algorithm>& algorithm = reduceScatters_[{c.send, c.sendCount}];
    if (!algorithm) {
      T* buffer = static_cast<T*>(const_cast<void*>(c.send));
      algorithm = std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(
          context_, std::vector<T*>{buffer}, static_cast<int>(c.sendCount),
          std::vector<int>(context_->size, static_cast<int>(c.count)), reductionFunction<T>(c.op));
    }
    return *algorithm;
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::map<std::pair<const void*, size_t>, std::unique_ptr<gloo::Algorithm>> reduceScatters_;
};

}  // namespace

int main(int argc, char** argv) {
  int rank = intFromEnv({"LOOM_RANK", "RANK", "OMPI_COMM_WORLD_RANK"}, 0);
  int nranks = intFromEnv({"LOOM_NRANKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}, 1);
  try {
    GlooBackend backend(rank, nranks);
    return perf::runPeerTest(argc, argv, backend);
  } catch (const std::exception& error) {
    // Gloo reports failures (timeouts, closed connections, bad arguments) as exceptions.
    fflush(stdout);
    fprintf(stderr, "gloo_perf: rank %d of %d: %s\n", rank, nranks, error.what());
    _exit(1);  // Gloo's transport threads may still hold the context: do not run its destructors
  }
}
