// libnccl.so.2: NCCL's host API, as the CUDA toolkit's nccl.h declares it, over loom. A program built against
// NCCL runs on loom by loading this library in NCCL's place (LD_PRELOAD, or LD_LIBRARY_PATH ahead of NCCL's).
//
// An ncclComm_t is a loom communicator with what NCCL keeps beside it: the CUDA device it was made on, the
// PreMulSum operators created on it, and its last error message. Results, datatypes and built-in operators have
// the same numbers in both APIs (checked below); the rest is translated here:
//   - communicators are CUDA ones (device buffers, calls queued on the cudaStream_t), or host ones where
//     LOOM_NCCL_DEVICE=host (host buffers, stream ignored, each call done when it returns or its group ends);
//   - ncclCommInitRank inside a group starts a non-blocking init and the group's end waits for it, which is how
//     one thread makes several communicators (ncclCommInitAll);
//   - ncclRedOpCreatePreMulSum's operators scale their input locally (premul.h), then sum;
//   - fp8 data moves as bytes; fp8 reductions are refused;
//   - ncclCommShrink is loomCommShrink;
//   - loomTimeout, which NCCL lacks, is ncclRemoteError: a peer that did not answer in time.
// Calls loom does not support return ncclInvalidUsage with a message (ncclGetLastError), never crash.
// docs/NCCL.md has the full table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// The library is built with hidden visibility; the declarations of nccl.h are its exported API.
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include "loom/loom.h"
#include "plugins/nccl/premul.h"
#include "src/base/cuda_util.h"
#include "src/base/log.h"
#include "src/base/params.h"

// The ABI this library implements is that of the toolkit's nccl.h. Where loom's numbers are passed through
// unchanged they must agree; where a struct is read field by field its layout must be the one written for here.
// A toolkit whose header differs fails the build here, not a program at run time.
static_assert(NCCL_MAJOR == 2, "the NCCL 2.x ABI");
static_assert(ncclSuccess == static_cast<int>(loomSuccess) &&
                  ncclUnhandledCudaError == static_cast<int>(loomUnhandledCudaError) &&
                  ncclSystemError == static_cast<int>(loomSystemError) &&
                  ncclInternalError == static_cast<int>(loomInternalError) &&
                  ncclInvalidArgument == static_cast<int>(loomInvalidArgument) &&
                  ncclInvalidUsage == static_cast<int>(loomInvalidUsage) &&
                  ncclRemoteError == static_cast<int>(loomRemoteError) &&
                  ncclInProgress == static_cast<int>(loomInProgress) && ncclNumResults == 8,
              "ncclResult_t and loomResult_t share codes 0 to 7");
static_assert(ncclInt8 == static_cast<int>(loomInt8) && ncclUint8 == static_cast<int>(loomUint8) &&
                  ncclInt32 == static_cast<int>(loomInt32) && ncclUint32 == static_cast<int>(loomUint32) &&
                  ncclInt64 == static_cast<int>(loomInt64) && ncclUint64 == static_cast<int>(loomUint64) &&
                  ncclFloat16 == static_cast<int>(loomFloat16) && ncclFloat32 == static_cast<int>(loomFloat32) &&
                  ncclFloat64 == static_cast<int>(loomFloat64) && ncclBfloat16 == static_cast<int>(loomBfloat16),
              "ncclDataType_t and loomDataType_t share values 0 to 9");
static_assert(ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
              "the fp8 types this library moves as bytes, and no others");
static_assert(ncclSum == static_cast<int>(loomSum) && ncclProd == static_cast<int>(loomProd) &&
                  ncclMax == static_cast<int>(loomMax) && ncclMin == static_cast<int>(loomMin) &&
                  ncclAvg == static_cast<int>(loomAvg) && ncclNumOps == static_cast<int>(loomNumOps),
              "ncclRedOp_t and loomRedOp_t share the built-in operators");
static_assert(sizeof(ncclRedOp_t) == sizeof(int), "ncclRedOp_t is an int-sized enum");
static_assert(sizeof(ncclUniqueId) == sizeof(loomUniqueId) && NCCL_UNIQUE_ID_BYTES == LOOM_UNIQUE_ID_BYTES,
              "a unique id is 128 opaque bytes in both APIs");
static_assert(NCCL_SPLIT_NOCOLOR == LOOM_SPLIT_NOCOLOR && NCCL_CONFIG_UNDEF_INT == LOOM_CONFIG_UNDEF_INT,
              "the split's no-color and the config's unset value agree");
static_assert(NCCL_SHRINK_DEFAULT == LOOM_SHRINK_DEFAULT && NCCL_SHRINK_ABORT == LOOM_SHRINK_ABORT,
              "ncclCommShrink's flags are loomCommShrink's");
static_assert(sizeof(void*) == 8, "the layouts below are LP64's");
static_assert(sizeof(ncclConfig_t) == 80 && offsetof(ncclConfig_t, blocking) == 16 &&
                  offsetof(ncclConfig_t, commName) == 48,
              "ncclConfig_t as of NCCL 2.28 (ncclConfig_v22800)");
static_assert(sizeof(ncclSimInfo_t) == 24 && offsetof(ncclSimInfo_t, estimatedTime) == 16,
              "ncclSimInfo_t as of NCCL 2.22 (ncclSimInfo_v22200)");

namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;   // NCCL_CONFIG_INITIALIZER's magic
constexpr unsigned kSimInfoMagic = 0x74685283;  // NCCL_SIM_INFO_INITIALIZER's magic

// One operator from ncclRedOpCreatePreMulSum: its handle is ncclNumOps + its index in the communicator's table.
struct PreMulSum {
  bool live = false;
  ncclDataType_t datatype = ncclFloat32;
  const void* scalar = nullptr;       // ncclScalarDevice: read when the call runs
  alignas(8) unsigned char value[8];  // ncclScalarHostImmediate: the value, copied at creation
};

}  // namespace

struct ncclComm {
  loomComm_t loom = nullptr;
  bool host = false;    // LOOM_NCCL_DEVICE=host
  int cudaDevice = -1;  // the device it was made on; -1 for a host communicator
  bool waitAtGroupEnd = false;
  std::mutex mutex;  // guards ops and lastError
  std::vector<PreMulSum> ops;
  char lastError[1024] = "";
};

struct ncclWindow_vidmem {
  ncclComm* comm;
  void* registration;
};

namespace {

// Makes the communicator's device current for the library's own CUDA calls, and restores the caller's: one thread
// may drive communicators on several devices, as NCCL allows. Nothing for a host communicator.
std::optional<loom::DeviceScope> onDeviceOf(const ncclComm* comm) {
  if (comm->host || comm->cudaDevice < 0) return std::nullopt;
  return std::optional<loom::DeviceScope>(std::in_place, comm->cudaDevice);
}

// Per thread: NCCL's group depth (kept beside loom's, which it mirrors), the communicators whose init the
// outermost group end waits for, the scratch buffers freed once the calls using them are queued, and the last
// error message.
struct Scratch {
  void* ptr;
  const ncclComm* comm;
  cudaStream_t stream;
};
thread_local int tGroupDepth = 0;
thread_local std::vector<ncclComm*> tPendingInits;
thread_local std::vector<Scratch> tScratch;
thread_local std::string tLastError;

ncclResult_t toNccl(loomResult_t result) {
  if (result >= loomSuccess && result <= loomInProgress) return static_cast<ncclResult_t>(result);
  if (result == loomTimeout) return ncclRemoteError;
  return ncclInternalError;
}

void keepMessage(ncclComm* comm, const char* message) {
  tLastError = message;
  if (comm == nullptr) return;
  std::lock_guard<std::mutex> lock(comm->mutex);
  std::snprintf(comm->lastError, sizeof(comm->lastError), "%s", message);
}

// An error this library finds itself: logged, kept for ncclGetLastError, returned.
__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclComm* comm, ncclResult_t code, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  LOOM_WARN(COLL, "%s", message);
  keepMessage(comm, message);
  return code;
}

// loom's result of a call made for `comm`, with loom's message kept for ncclGetLastError.
ncclResult_t fromLoom(ncclComm* comm, loomResult_t result) {
  if (result == loomSuccess || result == loomInProgress) return toNccl(result);
  const char* message = loomGetLastError(nullptr);
  if (message[0] == '\0' && comm != nullptr && comm->loom != nullptr) message = loomGetLastError(comm->loom);
  keepMessage(comm, message[0] != '\0' ? message : loomGetErrorString(result));
  return toNccl(result);
}

#define NCCL_CHECK(call)                          \
  do {                                            \
    ncclResult_t checked_ = (call);               \
    if (checked_ != ncclSuccess) return checked_; \
  } while (0)

// LOOM_NCCL_DEVICE: whether communicators are host ones.
ncclResult_t hostMode(bool* host, const char* fn) {
  std::string device = loom::params::ncclDevice();
  if (device == "cuda" || device == "host") {
    *host = device == "host";
    static std::once_flag announced;
    std::call_once(announced, [&]() {
      LOOM_INFO(INIT, "NCCL API %d.%d.%d (libnccl.so.2) over loom %d.%d.%d, %s communicators", NCCL_MAJOR, NCCL_MINOR,
                NCCL_PATCH, LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH, device.c_str());
    });
    return ncclSuccess;
  }
  return fail(nullptr, ncclInvalidArgument, "%s: LOOM_NCCL_DEVICE is \"%s\"; expected cuda or host", fn,
              device.c_str());
}

// NCCL's config, as loom's. Fields of later versions than the caller's header are not read; performance hints
// that loom has no use for (CTA counts, cgaClusterSize, netName, splitShare, trafficClass, collnetEnable,
// CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched) are accepted and ignored.
ncclResult_t translateConfig(const ncclConfig_t* config, loomConfig_t* out, bool* blocking, const char* fn) {
  *out = loomConfig_t(LOOM_CONFIG_INITIALIZER);
  *blocking = true;
  if (config == nullptr) return ncclSuccess;
  if (config->magic != kConfigMagic)
    return fail(nullptr, ncclInvalidArgument, "%s: config->magic is 0x%x, not 0x%x: start from NCCL_CONFIG_INITIALIZER",
                fn, config->magic, kConfigMagic);
  if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return fail(nullptr, ncclInvalidArgument, "%s: config->size %zu is too small for an ncclConfig_t", fn,
                config->size);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return fail(nullptr, ncclInvalidArgument, "%s: config->blocking is %d; expected 0 or 1", fn, config->blocking);
  *blocking = config->blocking != 0;
  if (config->size >= offsetof(ncclConfig_t, commName) + sizeof(const char*)) out->commName = config->commName;
  return ncclSuccess;
}

// Makes one communicator. cudaDevice: the device of a CUDA communicator (NCCL_CONFIG_UNDEF_INT: the current one).
ncclResult_t initRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config,
                      int cudaDevice, const char* fn) {
  if (newcomm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: newcomm is NULL", fn);
  bool host = false, blocking = true;
  NCCL_CHECK(hostMode(&host, fn));
  loomConfig_t options;
  NCCL_CHECK(translateConfig(config, &options, &blocking, fn));
  auto comm = std::make_unique<ncclComm>();
  comm->host = host;
  options.device = host ? loomDeviceHost : loomDeviceCuda;
  if (!host) {
    if (cudaDevice == NCCL_CONFIG_UNDEF_INT && cudaGetDevice(&cudaDevice) != cudaSuccess)
      cudaDevice = NCCL_CONFIG_UNDEF_INT;  // loom's init says why there is no device
    (void)cudaGetLastError();
    options.cudaDevice = cudaDevice;
    comm->cudaDevice = cudaDevice == NCCL_CONFIG_UNDEF_INT ? -1 : cudaDevice;
  }
  // Inside a group several communicators may be made by one thread: each init runs on a thread of its own and
  // the outermost group end waits for them.
  bool deferred = tGroupDepth > 0;
  options.blocking = deferred || !blocking ? 0 : 1;
  loomUniqueId loomId;
  std::memcpy(&loomId, &id, sizeof(loomId));
  loomResult_t result = loomCommInitRankConfig(&comm->loom, nranks, loomId, rank, &options);
  if (result != loomSuccess && result != loomInProgress) return fromLoom(nullptr, result);
  comm->waitAtGroupEnd = deferred && blocking;
  if (comm->waitAtGroupEnd) tPendingInits.push_back(comm.get());
  *newcomm = comm.release();
  return !blocking && result == loomInProgress ? ncclInProgress : ncclSuccess;
}

// Waits for the inits started inside the group that just ended; the first failure is the result. Each init has
// loom's deadlines, so this ends.
ncclResult_t finishPendingInits() {
  ncclResult_t first = ncclSuccess;
  for (ncclComm* comm : tPendingInits) {
    loomResult_t state = loomInProgress;
    while (loomCommGetAsyncError(comm->loom, &state) == loomSuccess && state == loomInProgress)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    comm->waitAtGroupEnd = false;
    if (state != loomSuccess && first == ncclSuccess) {
      keepMessage(comm, loomGetLastError(comm->loom));
      first = toNccl(state);
    }
  }
  tPendingInits.clear();
  return first;
}

void forgetPendingInit(ncclComm* comm) {
  tPendingInits.erase(std::remove(tPendingInits.begin(), tPendingInits.end(), comm), tPendingInits.end());
}

// Frees the scratch buffers of the calls queued so far: host ones once the calls are done (they are, outside a
// group), device ones in stream order after them.
void releaseScratch() {
  for (const Scratch& scratch : tScratch) {
    std::optional<loom::DeviceScope> device = onDeviceOf(scratch.comm);
    if (scratch.comm->host) {
      std::free(scratch.ptr);
    } else if (cudaFreeAsync(scratch.ptr, scratch.stream) != cudaSuccess) {
      LOOM_WARN(CUDA, "NCCL API: freeing a PreMulSum scratch buffer: %s", cudaGetErrorString(cudaGetLastError()));
    }
  }
  tScratch.clear();
}

// Releases the scratch of a call made outside a group when the call returns.
struct CallScope {
  ~CallScope() {
    if (tGroupDepth == 0 && !tScratch.empty()) releaseScratch();
  }
};

size_t elementBytes(ncclDataType_t datatype) {
  size_t bytes = 1;
  loom::nccl::visitType(datatype, [&]<typename T>(T*) { bytes = sizeof(T); });
  return bytes;
}

const char* typeName(ncclDataType_t datatype) {
  static const char* const kNames[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",      "ncclUint32",
                                       "ncclInt64",   "ncclUint64",   "ncclFloat16",    "ncclFloat32",
                                       "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  return datatype >= 0 && datatype < ncclNumTypes ? kNames[datatype] : "an unknown datatype";
}

// What a call runs on: the loom communicator, the stream (none for a host communicator) and loom's datatype.
struct Target {
  ncclComm* comm = nullptr;
  loomStream_t stream = nullptr;
  loomDataType_t type = loomUint8;
};

ncclResult_t target(ncclComm* comm, ncclDataType_t datatype, bool reduces, cudaStream_t stream, const char* fn,
                    Target* out) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: comm is NULL", fn);
  if (datatype >= ncclInt8 && datatype <= ncclBfloat16) {
    out->type = static_cast<loomDataType_t>(datatype);
  } else if (datatype == ncclFloat8e4m3 || datatype == ncclFloat8e5m2) {
    if (reduces)
      return fail(comm, ncclInvalidUsage,
                  "%s: %s reductions are not supported by loom; fp8 data moves as bytes (AllGather, Broadcast, "
                  "AlltoAll, Gather, Scatter, Send, Recv)",
                  fn, typeName(datatype));
    out->type = loomUint8;
  } else {
    return fail(comm, ncclInvalidArgument, "%s: datatype %d is not an NCCL datatype (0 to %d)", fn,
                static_cast<int>(datatype), ncclNumTypes - 1);
  }
  out->comm = comm;
  out->stream = comm->host ? nullptr : static_cast<loomStream_t>(stream);
  return ncclSuccess;
}

// A reduction operator: a built-in one, or a PreMulSum operator of the communicator (sum after scaling).
struct Reduction {
  loomRedOp_t op = loomSum;
  bool premul = false;
  PreMulSum scalar;
};

ncclResult_t reduction(ncclComm* comm, ncclRedOp_t op, ncclDataType_t datatype, const char* fn, Reduction* out) {
  int value = static_cast<int>(op);
  if (value >= 0 && value < ncclNumOps) {
    out->op = static_cast<loomRedOp_t>(value);
    return ncclSuccess;
  }
  std::lock_guard<std::mutex> lock(comm->mutex);
  size_t index = static_cast<size_t>(value) - ncclNumOps;
  if (value < 0 || index >= comm->ops.size() || !comm->ops[index].live)
    return fail(nullptr, ncclInvalidArgument,
                "%s: reduction operator %d is neither built in nor a live ncclRedOpCreatePreMulSum operator of this "
                "communicator",
                fn, value);
  if (comm->ops[index].datatype != datatype)
    return fail(nullptr, ncclInvalidArgument, "%s: operator %d was created for %s, the call is on %s", fn, value,
                typeName(comm->ops[index].datatype), typeName(datatype));
  out->premul = true;
  out->scalar = comm->ops[index];
  return ncclSuccess;
}

// What a reducing call runs on, and its operator.
ncclResult_t reducing(ncclComm* comm, ncclDataType_t datatype, ncclRedOp_t op, cudaStream_t stream, const char* fn,
                      Target* t, Reduction* red) {
  NCCL_CHECK(target(comm, datatype, true, stream, fn, t));
  return reduction(comm, op, datatype, fn, red);
}

// A buffer that lives until the call using it is queued (host: done).
ncclResult_t scratch(const Target& target, size_t bytes, void** out, const char* fn) {
  std::optional<loom::DeviceScope> device = onDeviceOf(target.comm);
  if (target.comm->host) {
    *out = std::malloc(bytes);
    if (*out == nullptr)
      return fail(target.comm, ncclSystemError, "%s: no host memory for a %zu-byte PreMulSum buffer", fn, bytes);
  } else {
    cudaStream_t stream = static_cast<cudaStream_t>(target.stream);
    if (cudaMallocAsync(out, bytes, stream) != cudaSuccess)
      return fail(target.comm, ncclUnhandledCudaError, "%s: cudaMallocAsync of a %zu-byte PreMulSum buffer: %s", fn,
                  bytes, cudaGetErrorString(cudaGetLastError()));
  }
  tScratch.push_back({*out, target.comm, static_cast<cudaStream_t>(target.stream)});
  return ncclSuccess;
}

// out = in * the operator's scalar, count elements: now on the host, or queued on the call's stream.
ncclResult_t premultiply(const Target& target, const Reduction& reduction, ncclDataType_t datatype, const void* in,
                         void* out, size_t count, const char* fn) {
  if (count == 0) return ncclSuccess;
  if (in == nullptr || out == nullptr)
    return fail(target.comm, ncclInvalidArgument, "%s: a NULL buffer for %zu elements", fn, count);
  const PreMulSum& op = reduction.scalar;
  if (target.comm->host) {
    const void* scalar = op.scalar != nullptr ? op.scalar : op.value;
    loom::nccl::visitType(datatype, [&]<typename T>(T*) {
      T factor;
      std::memcpy(static_cast<void*>(&factor), scalar, sizeof(T));
      const T* from = static_cast<const T*>(in);
      T* to = static_cast<T*>(out);
      for (size_t i = 0; i < count; ++i) to[i] = loom::nccl::premultiplied(from[i], factor);
    });
    return ncclSuccess;
  }
  std::optional<loom::DeviceScope> device = onDeviceOf(target.comm);
  cudaError_t error = loom::nccl::premulOnDevice(datatype, in, out, count, op.scalar != nullptr ? nullptr : op.value,
                                                 op.scalar, static_cast<cudaStream_t>(target.stream));
  if (error != cudaSuccess)
    return fail(target.comm, ncclUnhandledCudaError, "%s: PreMulSum's scaling kernel: %s", fn,
                cudaGetErrorString(error));
  return ncclSuccess;
}

}  // namespace

extern "C" {

// ----- Versions, errors, ids, memory

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (ncclGetLastError and LOOM_DEBUG=INFO tell more)";
    case ncclSystemError:
      return "unhandled system error (ncclGetLastError and LOOM_DEBUG=INFO tell more)";
    case ncclInternalError:
      return "internal error - please report this issue to the loom developers";
    case ncclInvalidArgument:
      return "invalid argument (ncclGetLastError names it)";
    case ncclInvalidUsage:
      return "invalid usage (ncclGetLastError tells why)";
    case ncclRemoteError:
      return "remote process exited, did not answer in time, or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr && comm->lastError[0] != '\0') return comm->lastError;
  return tLastError.c_str();
}

// Reads LOOM_DEBUG, LOOM_DEBUG_SUBSYS and LOOM_DEBUG_FILE again, as NCCL rereads NCCL_DEBUG.
void ncclResetDebugInit() { loom::reloadLogSettings(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  loomUniqueId id;
  loomResult_t result = loomGetUniqueId(&id);
  if (result != loomSuccess) return fromLoom(nullptr, result);
  std::memcpy(uniqueId, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  bool host = false;
  NCCL_CHECK(hostMode(&host, "ncclMemAlloc"));
  if (host) return fromLoom(nullptr, loomMemAlloc(ptr, size));
  cudaError_t error = cudaMalloc(ptr, size);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(nullptr, ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc of %zu bytes: %s", size,
                cudaGetErrorString(error));
  }
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  bool host = false;
  NCCL_CHECK(hostMode(&host, "ncclMemFree"));
  if (host) return fromLoom(nullptr, loomMemFree(ptr));
  cudaError_t error = cudaFree(ptr);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(nullptr, ncclUnhandledCudaError, "ncclMemFree: cudaFree(%p): %s", ptr, cudaGetErrorString(error));
  }
  return ncclSuccess;
}

// ----- Communicators

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config, NCCL_CONFIG_UNDEF_INT, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, nullptr, NCCL_CONFIG_UNDEF_INT, "ncclCommInitRank");
}

// Several ids only spread NCCL's bootstrap; loom's needs one, the first (which every rank must pass alike).
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRankScalable: nId %d and commIds %p: need at least one id",
                nId, static_cast<void*>(commIds));
  return initRank(newcomm, nranks, commIds[0], myrank, config, NCCL_CONFIG_UNDEF_INT, "ncclCommInitRankScalable");
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const char* fn = "ncclCommInitAll";
  if (comms == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: comms is NULL", fn);
  if (ndev < 1) return fail(nullptr, ncclInvalidArgument, "%s: ndev %d must be at least 1", fn, ndev);
  bool host = false;
  NCCL_CHECK(hostMode(&host, fn));
  if (!host && devlist == nullptr) {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
    (void)cudaGetLastError();
    if (visible < ndev)
      return fail(nullptr, ncclInvalidArgument,
                  "%s: %d communicators on the first %d devices, but %d are visible "
                  "(pass a devlist to put several on one device)",
                  fn, ndev, ndev, visible);
  }
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::fill(comms, comms + ndev, nullptr);
  ncclResult_t result = ncclGroupStart();
  for (int i = 0; i < ndev && result == ncclSuccess; ++i)
    result = initRank(&comms[i], ndev, id, i, nullptr, host ? NCCL_CONFIG_UNDEF_INT : devlist ? devlist[i] : i, fn);
  ncclResult_t ended = ncclGroupEnd();
  if (result == ncclSuccess) result = ended;
  if (result != ncclSuccess) {
    std::string message = tLastError;
    for (int i = 0; i < ndev; ++i) {
      if (comms[i] != nullptr) ncclCommAbort(comms[i]);
      comms[i] = nullptr;
    }
    tLastError = message;
  }
  return result;
}

// A communicator made from `parent` by loom (split, shrink): `make` gets the translated config (NULL: the parent's
// settings). The device, timeout and channels come from the parent; the new communicator is always complete on
// return.
ncclResult_t makeChild(ncclComm* parent, ncclConfig_t* config, ncclComm_t* newcomm, const char* fn,
                       const std::function<loomResult_t(loomConfig_t*, loomComm_t*)>& make) {
  if (parent == nullptr || newcomm == nullptr)
    return fail(nullptr, ncclInvalidArgument, "%s: comm and newcomm must not be NULL", fn);
  loomConfig_t options;
  bool blocking = true;
  NCCL_CHECK(translateConfig(config, &options, &blocking, fn));
  loomComm_t child = nullptr;
  loomResult_t result = make(config != nullptr ? &options : nullptr, &child);
  if (result != loomSuccess) return fromLoom(parent, result);
  *newcomm = nullptr;
  if (child == nullptr) return ncclSuccess;
  auto made = std::make_unique<ncclComm>();
  made->loom = child;
  made->host = parent->host;
  made->cudaDevice = parent->cudaDevice;
  *newcomm = made.release();
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  return makeChild(comm, config, newcomm, "ncclCommSplit", [&](loomConfig_t* options, loomComm_t* child) {
    return loomCommSplit(comm->loom, color, key, child, options);
  });
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  return makeChild(comm, config, newcomm, "ncclCommShrink", [&](loomConfig_t* options, loomComm_t* child) {
    return loomCommShrink(comm->loom, excludeRanksList, excludeRanksCount, child, options, shrinkFlags);
  });
}

// loomCommRevoke is synchronous: the communicator is quiescent when it returns, so its state goes straight to
// the failure of what it ended (never ncclInProgress); destroy, split and shrink may follow at once.
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommRevoke: comm is NULL");
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return fail(comm, ncclInvalidArgument, "ncclCommRevoke: revokeFlags is %d; NCCL_REVOKE_DEFAULT (0) is the only one",
                revokeFlags);
  return fromLoom(comm, loomCommRevoke(comm->loom));
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  return fromLoom(comm, loomCommFinalize(comm->loom));
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  forgetPendingInit(comm);
  ncclResult_t result = fromLoom(nullptr, loomCommDestroy(comm->loom));
  delete comm;
  return result;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  forgetPendingInit(comm);
  ncclResult_t result = fromLoom(nullptr, loomCommAbort(comm->loom));
  delete comm;
  return result;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclCommGetAsyncError: comm and asyncError must not be NULL");
  loomResult_t state = loomSuccess;
  loomResult_t result = loomCommGetAsyncError(comm->loom, &state);
  if (result != loomSuccess) return fromLoom(comm, result);
  if (state != loomSuccess && state != loomInProgress) keepMessage(comm, loomGetLastError(comm->loom));
  *asyncError = toNccl(state);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommCount: comm is NULL");
  return fromLoom(comm, loomCommCount(comm->loom, count));
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommUserRank: comm is NULL");
  return fromLoom(comm, loomCommUserRank(comm->loom, rank));
}

// A host communicator (LOOM_NCCL_DEVICE=host) has no device: -1.
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclCommCuDevice: comm and device must not be NULL");
  *device = comm->cudaDevice;
  return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommRegister: comm is NULL");
  return fromLoom(comm, loomCommRegister(comm->loom, buff, size, handle));
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
  return fromLoom(comm, loomCommDeregister(comm->loom, handle));
}

// A window is a registration: collectives on its memory are correct, and run as on any other memory (loom has
// no symmetric-memory kernels).
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  const char* fn = "ncclCommWindowRegister";
  if (comm == nullptr || win == nullptr)
    return fail(nullptr, ncclInvalidArgument, "%s: comm and win must not be NULL", fn);
  if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC)
    return fail(comm, ncclInvalidArgument, "%s: winFlags 0x%x: expected NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC",
                fn, static_cast<unsigned>(winFlags));
  void* registration = nullptr;
  NCCL_CHECK(fromLoom(comm, loomCommRegister(comm->loom, buff, size, &registration)));
  *win = new ncclWindow_vidmem{comm, registration};
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (comm == nullptr || win == nullptr || win->comm != comm)
    return fail(comm, ncclInvalidArgument, "ncclCommWindowDeregister: comm and a window registered on it are needed");
  ncclResult_t result = fromLoom(comm, loomCommDeregister(comm->loom, win->registration));
  if (result == ncclSuccess) delete win;
  return result;
}

// ----- Reduction operators

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  if (op == nullptr || scalar == nullptr || comm == nullptr)
    return fail(comm, ncclInvalidArgument, "%s: op, scalar and comm must not be NULL", fn);
  if (datatype == ncclFloat8e4m3 || datatype == ncclFloat8e5m2)
    return fail(comm, ncclInvalidUsage, "%s: %s reductions are not supported by loom", fn, typeName(datatype));
  if (datatype < ncclInt8 || datatype > ncclBfloat16)
    return fail(comm, ncclInvalidArgument, "%s: datatype %d is not an NCCL datatype", fn, static_cast<int>(datatype));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return fail(comm, ncclInvalidArgument, "%s: residence %d: expected ncclScalarDevice or ncclScalarHostImmediate", fn,
                static_cast<int>(residence));
  PreMulSum made;
  made.live = true;
  made.datatype = datatype;
  std::memset(made.value, 0, sizeof(made.value));
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(made.value, scalar, elementBytes(datatype));
  } else {
    made.scalar = scalar;
  }
  std::lock_guard<std::mutex> lock(comm->mutex);
  size_t index = 0;
  while (index < comm->ops.size() && comm->ops[index].live) ++index;
  if (index + ncclNumOps > static_cast<size_t>(ncclMaxRedOp))
    return fail(nullptr, ncclInvalidUsage, "%s: every operator handle is in use", fn);
  if (index == comm->ops.size()) comm->ops.emplace_back();
  comm->ops[index] = made;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + index);
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL");
  int value = static_cast<int>(op);
  std::lock_guard<std::mutex> lock(comm->mutex);
  size_t index = static_cast<size_t>(value) - ncclNumOps;
  if (value < ncclNumOps || index >= comm->ops.size() || !comm->ops[index].live)
    return fail(nullptr, ncclInvalidArgument, "ncclRedOpDestroy: operator %d is %s", value,
                value >= 0 && value < ncclNumOps ? "built in" : "not a live PreMulSum operator of this communicator");
  comm->ops[index].live = false;
  return ncclSuccess;
}

// ----- Collectives and point-to-point

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  Target t;
  Reduction red;
  NCCL_CHECK(reducing(comm, datatype, op, stream, fn, &t, &red));
  CallScope scope;
  if (red.premul) {
    NCCL_CHECK(premultiply(t, red, datatype, sendbuff, recvbuff, count, fn));
    sendbuff = recvbuff;
  }
  return fromLoom(comm, loomAllReduce(sendbuff, recvbuff, count, t.type, red.op, comm->loom, t.stream));
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduce";
  Target t;
  Reduction red;
  NCCL_CHECK(reducing(comm, datatype, op, stream, fn, &t, &red));
  CallScope scope;
  if (red.premul && count > 0) {
    int rank = -1;
    NCCL_CHECK(fromLoom(comm, loomCommUserRank(comm->loom, &rank)));
    void* scaled = rank == root ? recvbuff : nullptr;
    if (scaled == nullptr) NCCL_CHECK(scratch(t, count * elementBytes(datatype), &scaled, fn));
    NCCL_CHECK(premultiply(t, red, datatype, sendbuff, scaled, count, fn));
    sendbuff = scaled;
  }
  return fromLoom(comm, loomReduce(sendbuff, recvbuff, count, t.type, red.op, root, comm->loom, t.stream));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  Target t;
  Reduction red;
  NCCL_CHECK(reducing(comm, datatype, op, stream, fn, &t, &red));
  CallScope scope;
  if (red.premul && recvcount > 0) {
    int nranks = 0;
    NCCL_CHECK(fromLoom(comm, loomCommCount(comm->loom, &nranks)));
    size_t count = recvcount * static_cast<size_t>(nranks);
    void* scaled = nullptr;
    NCCL_CHECK(scratch(t, count * elementBytes(datatype), &scaled, fn));
    NCCL_CHECK(premultiply(t, red, datatype, sendbuff, scaled, count, fn));
    sendbuff = scaled;
  }
  return fromLoom(comm, loomReduceScatter(sendbuff, recvbuff, recvcount, t.type, red.op, comm->loom, t.stream));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclBroadcast", &t));
  return fromLoom(comm, loomBroadcast(sendbuff, recvbuff, count, t.type, root, comm->loom, t.stream));
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclBcast", &t));
  return fromLoom(comm, loomBroadcast(buff, buff, count, t.type, root, comm->loom, t.stream));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclAllGather", &t));
  return fromLoom(comm, loomAllGather(sendbuff, recvbuff, sendcount, t.type, comm->loom, t.stream));
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclAlltoAll", &t));
  return fromLoom(comm, loomAllToAll(sendbuff, recvbuff, count, t.type, comm->loom, t.stream));
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclGather", &t));
  return fromLoom(comm, loomGather(sendbuff, recvbuff, count, t.type, root, comm->loom, t.stream));
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclScatter", &t));
  return fromLoom(comm, loomScatter(sendbuff, recvbuff, count, t.type, root, comm->loom, t.stream));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclSend", &t));
  return fromLoom(comm, loomSend(sendbuff, count, t.type, peer, comm->loom, t.stream));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  Target t;
  NCCL_CHECK(target(comm, datatype, false, stream, "ncclRecv", &t));
  return fromLoom(comm, loomRecv(recvbuff, count, t.type, peer, comm->loom, t.stream));
}

// ----- Groups

ncclResult_t ncclGroupStart() {
  ++tGroupDepth;
  return fromLoom(nullptr, loomGroupStart());
}

ncclResult_t ncclGroupEnd() {
  if (tGroupDepth == 0) return fromLoom(nullptr, loomGroupEnd());  // loom's error: no matching start
  --tGroupDepth;
  ncclResult_t result = fromLoom(nullptr, loomGroupEnd());
  if (tGroupDepth > 0) return result;
  ncclResult_t inits = finishPendingInits();
  releaseScratch();
  return result != ncclSuccess ? result : inits;
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  const char* fn = "ncclGroupSimulateEnd";
  if (simInfo == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: simInfo is NULL", fn);
  if (simInfo->magic != kSimInfoMagic || simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))
    return fail(nullptr, ncclInvalidArgument, "%s: simInfo was not set from NCCL_SIM_INFO_INITIALIZER", fn);
  loomSimInfo_t estimate = LOOM_SIM_INFO_INITIALIZER;
  ncclResult_t result = fromLoom(nullptr, loomGroupSimulateEnd(&estimate));
  if (result != ncclSuccess) return result;  // the group stays open, as loom leaves it
  tGroupDepth = 0;
  simInfo->estimatedTime = estimate.estimatedTime;
  ncclResult_t inits = finishPendingInits();
  releaseScratch();
  return inits;
}

// ----- The profiling interface's names (pncclX is ncclX), as NCCL exports them

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // ncclResetDebugInit is deprecated, still exported
#define LOOM_NCCL_ALIAS(name) __typeof__(name) p##name __attribute__((alias(#name)));
LOOM_NCCL_ALIAS(ncclGetVersion)
LOOM_NCCL_ALIAS(ncclGetErrorString)
LOOM_NCCL_ALIAS(ncclGetLastError)
LOOM_NCCL_ALIAS(ncclResetDebugInit)
LOOM_NCCL_ALIAS(ncclGetUniqueId)
LOOM_NCCL_ALIAS(ncclMemAlloc)
LOOM_NCCL_ALIAS(ncclMemFree)
LOOM_NCCL_ALIAS(ncclCommInitRankConfig)
LOOM_NCCL_ALIAS(ncclCommInitRank)
LOOM_NCCL_ALIAS(ncclCommInitRankScalable)
LOOM_NCCL_ALIAS(ncclCommInitAll)
LOOM_NCCL_ALIAS(ncclCommSplit)
LOOM_NCCL_ALIAS(ncclCommShrink)
LOOM_NCCL_ALIAS(ncclCommRevoke)
LOOM_NCCL_ALIAS(ncclCommFinalize)
LOOM_NCCL_ALIAS(ncclCommDestroy)
LOOM_NCCL_ALIAS(ncclCommAbort)
LOOM_NCCL_ALIAS(ncclCommGetAsyncError)
LOOM_NCCL_ALIAS(ncclCommCount)
LOOM_NCCL_ALIAS(ncclCommUserRank)
LOOM_NCCL_ALIAS(ncclCommCuDevice)
LOOM_NCCL_ALIAS(ncclCommRegister)
LOOM_NCCL_ALIAS(ncclCommDeregister)
LOOM_NCCL_ALIAS(ncclCommWindowRegister)
LOOM_NCCL_ALIAS(ncclCommWindowDeregister)
LOOM_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
LOOM_NCCL_ALIAS(ncclRedOpDestroy)
LOOM_NCCL_ALIAS(ncclAllReduce)
LOOM_NCCL_ALIAS(ncclReduce)
LOOM_NCCL_ALIAS(ncclReduceScatter)
LOOM_NCCL_ALIAS(ncclBroadcast)
LOOM_NCCL_ALIAS(ncclBcast)
LOOM_NCCL_ALIAS(ncclAllGather)
LOOM_NCCL_ALIAS(ncclAlltoAll)
LOOM_NCCL_ALIAS(ncclGather)
LOOM_NCCL_ALIAS(ncclScatter)
LOOM_NCCL_ALIAS(ncclSend)
LOOM_NCCL_ALIAS(ncclRecv)
LOOM_NCCL_ALIAS(ncclGroupStart)
LOOM_NCCL_ALIAS(ncclGroupEnd)
LOOM_NCCL_ALIAS(ncclGroupSimulateEnd)
#pragma GCC diagnostic pop

}  // extern "C"
