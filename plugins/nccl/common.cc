// The NCCL-compatible library's shared state and helpers (common.h): errors, the per-thread state, config and init.
#include "plugins/nccl/common.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "plugins/nccl/premul.h"
#include "src/base/log.h"
#include "src/base/params.h"

namespace loom::nccl::shim {

constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic

// Per thread: NCCL's group depth (kept beside loom's, which it mirrors), the communicators whose init the
// outermost group end waits for, and the last error message (the scratch buffers of calls: collectives.cc).
thread_local int tGroupDepth = 0;
thread_local std::vector<ncclComm*> tPendingInits;
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

ncclResult_t fromLoom(ncclComm* comm, loomResult_t result) {
  if (result == loomSuccess || result == loomInProgress) return toNccl(result);
  const char* message = loomGetLastError(nullptr);
  if (message[0] == '\0' && comm != nullptr && comm->loom != nullptr) message = loomGetLastError(comm->loom);
  keepMessage(comm, message[0] != '\0' ? message : loomGetErrorString(result));
  return toNccl(result);
}

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

}  // namespace loom::nccl::shim
