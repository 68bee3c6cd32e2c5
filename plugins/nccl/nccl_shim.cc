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
//
// The files: common.h and common.cc (the communicator, errors, per-thread state, config and init that the calls
// share), this one (the ABI's checks; versions, errors, ids, memory, communicators and operators) and
// collectives.cc (collectives, point-to-point and groups).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "plugins/nccl/common.h"
#include "src/base/log.h"

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

using namespace loom::nccl::shim;

struct ncclWindow_vidmem {
  ncclComm* comm;
  void* registration;
};

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

// ----- The profiling interface's names (pncclX is ncclX), as NCCL exports them

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // ncclResetDebugInit is deprecated, still exported
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
#pragma GCC diagnostic pop

}  // extern "C"
