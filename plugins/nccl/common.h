// What the NCCL-compatible library's calls share (nccl_shim.cc describes the library): the communicator behind an
// ncclComm_t, the per-thread state, and the errors, config and init of common.cc. Internal to plugins/nccl.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

// The library is built with hidden visibility; the declarations of nccl.h are its exported API.
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include "loom/loom.h"

namespace loom::nccl::shim {

// One operator from ncclRedOpCreatePreMulSum: its handle is ncclNumOps + its index in the communicator's table.
struct PreMulSum {
  bool live = false;
  ncclDataType_t datatype = ncclFloat32;
  const void* scalar = nullptr;       // ncclScalarDevice: read when the call runs
  alignas(8) unsigned char value[8];  // ncclScalarHostImmediate: the value, copied at creation
};

}  // namespace loom::nccl::shim

struct ncclComm {
  loomComm_t loom = nullptr;
  bool host = false;    // LOOM_NCCL_DEVICE=host
  int cudaDevice = -1;  // the device it was made on; -1 for a host communicator
  bool waitAtGroupEnd = false;
  std::mutex mutex;  // guards ops and lastError
  std::vector<loom::nccl::shim::PreMulSum> ops;
  char lastError[1024] = "";
};

namespace loom::nccl::shim {

// Per thread (common.cc): NCCL's group depth (kept beside loom's, which it mirrors) and the last error message.
extern thread_local int tGroupDepth;
extern thread_local std::string tLastError;

ncclResult_t toNccl(loomResult_t result);

void keepMessage(ncclComm* comm, const char* message);

// An error this library finds itself: logged, kept for ncclGetLastError, returned.
__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclComm* comm, ncclResult_t code, const char* format, ...);

// loom's result of a call made for `comm`, with loom's message kept for ncclGetLastError.
ncclResult_t fromLoom(ncclComm* comm, loomResult_t result);

// LOOM_NCCL_DEVICE: whether communicators are host ones.
ncclResult_t hostMode(bool* host, const char* fn);

// NCCL's config, as loom's. Fields of later versions than the caller's header are not read; performance hints
// that loom has no use for (CTA counts, cgaClusterSize, netName, splitShare, trafficClass, collnetEnable,
// CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched) are accepted and ignored.
ncclResult_t translateConfig(const ncclConfig_t* config, loomConfig_t* out, bool* blocking, const char* fn);

// Makes one communicator. cudaDevice: the device of a CUDA communicator (NCCL_CONFIG_UNDEF_INT: the current one).
ncclResult_t initRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config,
                      int cudaDevice, const char* fn);

// Waits for the inits started inside the group that just ended; the first failure is the result. Each init has
// loom's deadlines, so this ends.
ncclResult_t finishPendingInits();

void forgetPendingInit(ncclComm* comm);

size_t elementBytes(ncclDataType_t datatype);

const char* typeName(ncclDataType_t datatype);

}  // namespace loom::nccl::shim

#define NCCL_CHECK(call)                          \
  do {                                            \
    ncclResult_t checked_ = (call);               \
    if (checked_ != ncclSuccess) return checked_; \
  } while (0)

// pncclX, the profiling interface's name for ncclX (an alias, so written in the file that defines ncclX).
#define LOOM_NCCL_ALIAS(name) __typeof__(name) p##name __attribute__((alias(#name)));
