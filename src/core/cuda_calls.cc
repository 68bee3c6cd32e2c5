// CUDA communicators' staged calls (cuda_calls.h). Compiled in every build; without CUDA (LOOM_HAVE_CUDA unset)
// a CUDA communicator is refused at init with a message that says so.
#include "src/core/cuda_calls.h"

#include "src/base/check.h"
#include "src/core/comm.h"

#if LOOM_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "src/base/cuda_util.h"
#include "src/base/log.h"
#include "src/base/params.h"
#include "src/base/wait.h"
#include "src/core/cuda_device.h"
#include "src/core/staging.h"
#include "src/core/stream.h"
#include "src/exec/cuda/kernels.h"
#endif

namespace loom {

#if LOOM_HAVE_CUDA

namespace {

// The driver's stream wait on a 64-bit word, found through the runtime (libloom does not link libcuda), or null
// where the driver or `device` lacks it.
PFN_cuStreamWaitValue64_v11070 streamWaitValue64(int device) {
  cudaDriverEntryPointQueryResult found{};
  void* wait = nullptr;
  void* attribute = nullptr;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &wait, 11070, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &attribute, 2000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  int supported = 0;
  auto getAttribute = reinterpret_cast<PFN_cuDeviceGetAttribute_v2000>(attribute);
  if (getAttribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) != CUDA_SUCCESS || !supported)
    return nullptr;
  return reinterpret_cast<PFN_cuStreamWaitValue64_v11070>(wait);
}

// The staging memory of one queued task, and the two events that bracket its use on the stream.
struct Slot {
  char* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t inputsReady = nullptr;  // the inputs are in `host`
  cudaEvent_t released = nullptr;     // the outputs are back on the device: the slot may be reused
  bool busy = false;
  bool shared = false;  // loomMemAlloc memory pinned by cudaHostRegister (else cudaHostAlloc)
  uint64_t lastUse = 0;  // the sequence number of the last call that held it
};

struct Task {
  std::vector<Call> calls;  // pointing into the slot
  Slot* slot;
  uint64_t sequence;
};

}  // namespace

// A CUDA communicator's extension (loomComm::extension): its staged calls' worker and its GPU executor.
class CudaCalls final : public CommExtension {
 public:
  CudaCalls(loomComm* comm, int device) : comm_(comm), device_(device) {}
  ~CudaCalls();
  loomResult_t start(const std::string& gateKind);
  loomResult_t connected() { return devicePathCreate(comm_, device_, &deviceGate_->abort, &devicePath_); }
  loomResult_t enqueue(std::vector<Call> calls);
  loomResult_t kernelError() { return devicePath_ ? devicePathError(*devicePath_) : loomSuccess; }
  const char* gateName() const { return waitValue64_ ? "memop (cuStreamWaitValue64)" : "kernel"; }
  // The memop gate sees only `done`: past every sequence number there will be.
  void abort() {
    std::atomic_ref<uint32_t>(gate_->abort).store(1, std::memory_order_release);
    open(kOpenForever);
  }

 private:
  loomResult_t checkReachable(const Call& call, const BufferExtent& extent) const;
  loomResult_t acquire(size_t bytes, Slot** slot);
  loomResult_t allocateStaging(size_t capacity, Slot* slot);
  void releaseStaging(Slot* slot);
  loomResult_t waitForInputs(const Slot& slot) const;
  loomResult_t enqueueGate(uint64_t sequence, cudaStream_t stream);
  void work();
  // Opens the gate up to `sequence`, unless abort() has opened it for good (the two may race).
  void open(uint64_t sequence) {
    std::atomic_ref<uint64_t> done(gate_->done);
    uint64_t seen = done.load(std::memory_order_relaxed);
    while (seen != kOpenForever &&
           !done.compare_exchange_weak(seen, sequence, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }
  static constexpr uint64_t kOpenForever = uint64_t{1} << 62;
  // Calls in flight at most: each holds a slot of pinned memory as large as its buffers.
  static constexpr size_t kMaxSlots = 4;

  loomComm* comm_;
  const int device_;
  device::StreamGate* gate_ = nullptr;                    // pinned, mapped
  device::StreamGate* deviceGate_ = nullptr;              // the device's view of it
  PFN_cuStreamWaitValue64_v11070 waitValue64_ = nullptr;  // set: the gate is a memop, else a kernel
  std::mutex enqueueMutex_;                               // slots_ and the order of sequence numbers
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t nextSequence_ = 1;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::thread worker_;
  DevicePathPtr devicePath_;  // the GPU executor, where there is one
};

loomResult_t CudaCalls::start(const std::string& gateKind) {
  if (gateKind != "auto" && gateKind != "memop" && gateKind != "kernel")
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_CUDA_GATE=\"%s\" is none of auto, memop and kernel",
                     gateKind.c_str());
  DeviceScope scope(device_);
  if (gateKind != "kernel") waitValue64_ = streamWaitValue64(device_);
  if (gateKind == "memop" && waitValue64_ == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT,
                     "LOOM_CUDA_GATE=memop: the driver or device %d has no 64-bit stream "
                     "memory operations (cuStreamWaitValue64)",
                     device_);
  void* gate = nullptr;
  LOOM_CUDA_CHECK(cudaHostAlloc(&gate, sizeof(device::StreamGate), cudaHostAllocMapped | cudaHostAllocPortable),
                  "CUDA communicator: cudaHostAlloc of the stream gate");
  gate_ = static_cast<device::StreamGate*>(gate);
  *gate_ = device::StreamGate{};
  void* deviceGate = nullptr;
  LOOM_CUDA_CHECK(cudaHostGetDevicePointer(&deviceGate, gate, 0), "CUDA communicator: cudaHostGetDevicePointer");
  deviceGate_ = static_cast<device::StreamGate*>(deviceGate);
  worker_ = std::thread([this] { work(); });
  return loomSuccess;
}

CudaCalls::~CudaCalls() {
  devicePath_.reset();  // first: its kernels read the gate's abort word
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();  // it finishes what is queued first (the communicator waited for idle before this)
  }
  // A stream may still be copying out of a slot, or about to read the gate: free them only once each stream has
  // passed, within the communicator's deadline; past it, leak them rather than free memory in use.
  DeviceScope scope(device_);
  Deadline deadline(comm_->settings.timeoutMs);
  Backoff backoff;
  bool leak = false;
  for (const auto& slot : slots_) {
    while (slot->busy && cudaEventQuery(slot->released) == cudaErrorNotReady && !deadline.expired()) backoff.pause();
    if (slot->busy && cudaEventQuery(slot->released) == cudaErrorNotReady) leak = true;
  }
  if (leak) {
    LOOM_WARN(CUDA,
              "rank %d: a CUDA stream had not passed this communicator's last call within %lld ms of its "
              "destruction: its staging memory is left allocated",
              comm_->rank, (long long)comm_->settings.timeoutMs);
    return;
  }
  for (const auto& slot : slots_) {
    releaseStaging(slot.get());
    cudaEventDestroy(slot->inputsReady);
    cudaEventDestroy(slot->released);
  }
  if (gate_ != nullptr) cudaFreeHost(gate_);
}

loomResult_t CudaCalls::checkReachable(const Call& call, const BufferExtent& extent) const {
  const char* what = collectiveName(call.collective);
  cudaPointerAttributes attributes{};
  cudaError_t error = cudaPointerGetAttributes(&attributes, extent.base);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear it: the call is refused, the context is fine
    return LOOM_FAIL(loomInvalidArgument, CUDA, "%s on a CUDA communicator: %s %p is not memory CUDA knows (%s)", what,
                     extent.name, static_cast<void*>(extent.base), cudaGetErrorString(error));
  }
  if (attributes.type == cudaMemoryTypeUnregistered)
    return LOOM_FAIL(loomInvalidArgument, CUDA,
                     "%s on a CUDA communicator: %s %p is ordinary host memory; a CUDA communicator takes device "
                     "memory (cudaMalloc), managed memory or pinned host memory",
                     what, extent.name, static_cast<void*>(extent.base));
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_)
    return LOOM_FAIL(loomInvalidArgument, CUDA,
                     "%s on a CUDA communicator: %s %p is on device %d, the communicator "
                     "on device %d",
                     what, extent.name, static_cast<void*>(extent.base), attributes.device, device_);
  return loomSuccess;
}

// Staging memory is loomMemAlloc memory, which peers on the host read in place as they read the perf programs'
// buffers, pinned for the device's copies with cudaHostRegister; where it cannot be pinned, pinned memory of
// cudaHostAlloc, which peers reach through the FIFOs.
loomResult_t CudaCalls::allocateStaging(size_t capacity, Slot* slot) {
  void* host = nullptr;
  if (loomMemAlloc(&host, capacity) == loomSuccess) {
    cudaError_t error = cudaHostRegister(host, capacity, cudaHostRegisterPortable);
    if (error == cudaSuccess) {
      slot->host = static_cast<char*>(host);
      slot->capacity = capacity;
      slot->shared = true;
      LOOM_INFO(CUDA, "rank %d: %zu bytes of shared, pinned staging memory (%zu slots)", comm_->rank, capacity,
                slots_.size());
      return loomSuccess;
    }
    cudaGetLastError();
    loomMemFree(host);
    LOOM_INFO(CUDA, "rank %d: cudaHostRegister of shared staging memory failed (%s): using cudaHostAlloc", comm_->rank,
              cudaGetErrorString(error));
  }
  clearThreadLastError();
  LOOM_CUDA_CHECK(cudaHostAlloc(&host, capacity, cudaHostAllocPortable),
                  "CUDA communicator: cudaHostAlloc of staging memory");
  slot->host = static_cast<char*>(host);
  slot->capacity = capacity;
  slot->shared = false;
  return loomSuccess;
}

void CudaCalls::releaseStaging(Slot* slot) {
  if (slot->host == nullptr) return;
  if (slot->shared) {
    cudaHostUnregister(slot->host);
    loomMemFree(slot->host);
  } else {
    cudaFreeHost(slot->host);
  }
  slot->host = nullptr;
  slot->capacity = 0;
}

// A free slot of at least `bytes`. All kMaxSlots slots are made together, and every free slot grows together
// (to the power of two that holds the call, and never below the largest so far), so that a loop of calls settles
// on slots that fit after its first call rather than pinning memory call after call. Of the free slots that fit
// it takes the one used longest ago: slots taken in turn are all in use (pinned, and mapped by the peers that read
// them in place) after a few calls, such as a warm-up's, rather than the last ones waiting for a timed loop that
// keeps more calls in flight. When every slot is in flight it waits, within the deadline, for a stream to pass
// the call holding one.
loomResult_t CudaCalls::acquire(size_t bytes, Slot** out) {
  if (slots_.empty()) {
    for (size_t i = 0; i < kMaxSlots; ++i) {
      auto slot = std::make_unique<Slot>();
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&slot->inputsReady, cudaEventDisableTiming),
                      "CUDA communicator: cudaEventCreate");
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&slot->released, cudaEventDisableTiming),
                      "CUDA communicator: cudaEventCreate");
      slots_.push_back(std::move(slot));
    }
  }
  Deadline deadline(comm_->settings.timeoutMs);
  Backoff backoff;
  for (;;) {
    Slot* fits = nullptr;
    Slot* small = nullptr;
    size_t largest = size_t{64} << 10;
    for (const auto& slot : slots_) {
      largest = std::max(largest, slot->capacity);
      if (slot->busy) {
        cudaError_t state = cudaEventQuery(slot->released);
        if (state == cudaErrorNotReady) continue;
        if (state != cudaSuccess) return cudaFailed(state, "CUDA communicator: cudaEventQuery of a staging slot");
        slot->busy = false;
      }
      if (slot->capacity < bytes)
        small = slot.get();
      else if (fits == nullptr || slot->lastUse < fits->lastUse)
        fits = slot.get();
    }
    if (fits == nullptr && small != nullptr) {
      const size_t capacity = std::max(std::bit_ceil(bytes), largest);
      for (const auto& slot : slots_) {
        if (slot->busy || slot->capacity >= capacity) continue;
        releaseStaging(slot.get());
        LOOM_CHECK(allocateStaging(capacity, slot.get()));
      }
      fits = small;
    }
    if (fits != nullptr) {
      *out = fits;
      return loomSuccess;
    }
    if (comm_->abortFlag.load(std::memory_order_relaxed))
      return LOOM_FAIL(loomRemoteError, CUDA, "rank %d: communicator aborted while its calls filled the stream",
                       comm_->rank);
    if (deadline.expired())
      return LOOM_FAIL(loomTimeout, CUDA,
                       "rank %d: %zu calls queued on CUDA streams were not reached within %lld ms (LOOM_TIMEOUT_MS or "
                       "config timeoutMs)",
                       comm_->rank, kMaxSlots, (long long)deadline.timeoutMs());
    backoff.pause();
  }
}

loomResult_t CudaCalls::enqueue(std::vector<Call> calls) {
  std::vector<BufferExtent> extents;
  for (const Call& call : calls) {
    size_t first = extents.size();
    extentsOf(call, comm_->nranks, &extents);
    for (size_t i = first; i < extents.size(); ++i) LOOM_CHECK(checkReachable(call, extents[i]));
  }
  if (devicePath_ && calls.size() == 1 && devicePathTakes(*devicePath_, calls.front()))
    return devicePathEnqueue(*devicePath_, calls.front());
  size_t totalBytes = 0;
  std::vector<StagedSpan> spans = spansOf(extents, &totalBytes);
  auto stream = static_cast<cudaStream_t>(calls.front().stream);

  std::lock_guard<std::mutex> lock(enqueueMutex_);
  DeviceScope scope(device_);
  Slot* slot = nullptr;
  LOOM_CHECK(acquire(totalBytes, &slot));
  for (Call& call : calls) {
    for (auto& input : call.inputs) input = stagedPointer(spans, slot->host, input);
    for (auto& output : call.outputs) output = stagedPointer(spans, slot->host, output);
  }
  const char* what = "CUDA communicator: enqueueing a call on its stream";
  for (const StagedSpan& span : spans)
    if (span.copyIn)
      LOOM_CUDA_CHECK(cudaMemcpyAsync(slot->host + span.offset, span.base, span.bytes, cudaMemcpyDefault, stream),
                      what);
  LOOM_CUDA_CHECK(cudaEventRecord(slot->inputsReady, stream), what);
  // From the gate on, the task must reach the worker: the stream now waits for it.
  const uint64_t sequence = nextSequence_++;
  slot->lastUse = sequence;
  LOOM_CHECK(enqueueGate(sequence, stream));
  loomResult_t result = loomSuccess;
  for (const StagedSpan& span : spans)
    if (span.copyOut && result == loomSuccess) {
      cudaError_t error = cudaMemcpyAsync(span.base, slot->host + span.offset, span.bytes, cudaMemcpyDefault, stream);
      if (error != cudaSuccess) result = cudaFailed(error, what);
    }
  if (result == loomSuccess) {
    cudaError_t error = cudaEventRecord(slot->released, stream);
    if (error != cudaSuccess) result = cudaFailed(error, what);
  }
  // After a failure here the outputs cannot come back: the call still runs (its peers wait for it), and the
  // communicator is marked failed.
  if (result != loomSuccess) {
    int expected = loomSuccess;
    comm_->asyncError.compare_exchange_strong(expected, result);
  }
  slot->busy = true;
  for (const Call& call : calls) call.comm->activeCalls.fetch_add(1);
  {
    std::lock_guard<std::mutex> queueLock(mutex_);
    queue_.push_back(Task{std::move(calls), slot, sequence});
  }
  wake_.notify_all();
  return result;
}

loomResult_t CudaCalls::enqueueGate(uint64_t sequence, cudaStream_t stream) {
  if (waitValue64_ == nullptr) return device::enqueueGateWait(deviceGate_, sequence, stream);
  CUresult result = waitValue64_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(&deviceGate_->done),
                                 sequence, CU_STREAM_WAIT_VALUE_GEQ);
  if (result != CUDA_SUCCESS)
    return LOOM_FAIL(loomUnhandledCudaError, CUDA, "CUDA communicator: cuStreamWaitValue64 failed (CUresult %d)",
                     static_cast<int>(result));
  return loomSuccess;
}

// Until the stream has copied the inputs: bounded by the communicator's deadline and abort flag (the stream may
// be busy with earlier work of the application; the deadline is the same as for a silent peer).
loomResult_t CudaCalls::waitForInputs(const Slot& slot) const {
  Deadline deadline(comm_->settings.timeoutMs);
  Backoff backoff;
  for (;;) {
    cudaError_t state = cudaEventQuery(slot.inputsReady);
    if (state == cudaSuccess) return loomSuccess;
    if (state != cudaErrorNotReady) return cudaFailed(state, "CUDA communicator: waiting for a call's inputs");
    if (comm_->abortFlag.load(std::memory_order_relaxed))
      return LOOM_FAIL(loomRemoteError, CUDA,
                       "rank %d: communicator aborted while its stream had not yet reached "
                       "a queued call",
                       comm_->rank);
    if (deadline.expired())
      return LOOM_FAIL(loomTimeout, CUDA,
                       "rank %d: the stream had not reached a queued call after %lld ms "
                       "(LOOM_TIMEOUT_MS or config timeoutMs)",
                       comm_->rank, (long long)deadline.timeoutMs());
    backoff.pause();
  }
}

void CudaCalls::work() {
  cudaSetDevice(device_);
  ScopedLogRank logRank(comm_->rank);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    loomResult_t result = loomSuccess;
    int pending = comm_->asyncError.load();
    if (pending != loomSuccess) {
      // An earlier call failed: the communicator cannot be trusted; release the stream at once.
      result = static_cast<loomResult_t>(pending);
    } else {
      result = waitForInputs(*task.slot);
      if (result == loomSuccess) result = runCalls(task.calls);
      if (result != loomSuccess) {
        // The caller returned long ago: the error is the communicator's (loomCommGetAsyncError), and its peers
        // learn of it through the abort of its connections.
        comm_->setLastError(threadLastError());
        int expected = loomSuccess;
        comm_->asyncError.compare_exchange_strong(expected, result);
        std::lock_guard<std::mutex> runLock(comm_->runMutex);
        comm_->connections.abortAll();
      }
    }
    open(task.sequence);
    for (const Call& call : task.calls) call.comm->activeCalls.fetch_sub(1);
    lock.lock();
  }
}

loomResult_t cudaCommAttach(loomComm* comm, int ordinal) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    cudaGetLastError();
    return LOOM_FAIL(loomInvalidArgument, INIT, "config device cuda: no usable CUDA device (%s)",
                     error != cudaSuccess ? cudaGetErrorString(error) : "none found");
  }
  if (ordinal == LOOM_CONFIG_UNDEF_INT) LOOM_CUDA_CHECK(cudaGetDevice(&ordinal), "config device cuda: cudaGetDevice");
  if (ordinal < 0 || ordinal >= count)
    return LOOM_FAIL(loomInvalidArgument, INIT, "config cudaDevice %d: this process sees %d CUDA device(s), 0 to %d",
                     ordinal, count, count - 1);
  cudaDeviceProp properties{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&properties, ordinal), "config device cuda: cudaGetDeviceProperties");
  auto calls = std::make_unique<CudaCalls>(comm, ordinal);
  LOOM_CHECK(calls->start(params::cudaGate()));
  comm->settings.cudaDevice = ordinal;
  CudaCalls& attached = comm->attach(std::move(calls));
  LOOM_INFO(CUDA,
            "rank %d: CUDA communicator on device %d (%s, bus %02x:%02x), calls staged through host memory, "
            "streams gated by a %s",
            comm->rank, ordinal, properties.name, properties.pciBusID, properties.pciDeviceID, attached.gateName());
  return loomSuccess;
}

loomResult_t cudaEnqueue(std::vector<Call> calls) {
  loomComm* comm = calls.front().comm;
  if (isHostStream(calls.front().stream))
    return LOOM_FAIL(loomInvalidArgument, COLL,
                     "%s: stream %p is a loom host stream; a CUDA communicator takes a "
                     "cudaStream_t (or NULL, the default stream)",
                     collectiveName(calls.front().collective), calls.front().stream);
  return comm->extension<CudaCalls>()->enqueue(std::move(calls));
}

loomResult_t cudaCommConnected(loomComm* comm) { return comm->extension<CudaCalls>()->connected(); }

void cudaCommCheckKernels(loomComm* comm) {
  // Only once init has ended (a non-blocking init sets the executor up on its own thread) and nothing has failed.
  CudaCalls* calls = comm->extension<CudaCalls>();
  if (calls == nullptr || comm->asyncError.load() != loomSuccess) return;
  loomResult_t error = calls->kernelError();
  if (error == loomSuccess) return;
  int expected = loomSuccess;
  comm->asyncError.compare_exchange_strong(expected, error);
}

void cudaCommAbort(loomComm* comm) {
  if (CudaCalls* calls = comm->extension<CudaCalls>()) calls->abort();
}

#else  // no CUDA in this build

loomResult_t cudaCommAttach(loomComm*, int) {
  return LOOM_FAIL(loomInvalidArgument, INIT, "config device cuda: this loom build has no CUDA (meson option cuda)");
}

loomResult_t cudaEnqueue(std::vector<Call> calls) {
  return LOOM_FAIL(loomInternalError, COLL, "%s: a CUDA call in a build without CUDA",
                   collectiveName(calls.front().collective));
}

loomResult_t cudaCommConnected(loomComm*) { return loomSuccess; }
void cudaCommCheckKernels(loomComm*) {}
void cudaCommAbort(loomComm*) {}

#endif

}  // namespace loom
