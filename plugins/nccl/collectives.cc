// The NCCL API's collectives, point-to-point calls and groups (nccl_shim.cc describes the library), and what a
// call runs on: its communicator's stream and loom's datatype, its reduction operator, and PreMulSum's scaling
// into scratch buffers that are freed once the calls using them are queued.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "plugins/nccl/common.h"
#include "plugins/nccl/premul.h"
#include "src/base/cuda_util.h"
#include "src/base/log.h"

using namespace loom::nccl::shim;

namespace {

constexpr unsigned kSimInfoMagic = 0x74685283;  // NCCL_SIM_INFO_INITIALIZER's magic

// Makes the communicator's device current for the library's own CUDA calls, and restores the caller's: one thread
// may drive communicators on several devices, as NCCL allows. Nothing for a host communicator.
std::optional<loom::DeviceScope> onDeviceOf(const ncclComm* comm) {
  if (comm->host || comm->cudaDevice < 0) return std::nullopt;
  return std::optional<loom::DeviceScope>(std::in_place, comm->cudaDevice);
}

// Per thread: the scratch buffers freed once the calls using them are queued.
struct Scratch {
  void* ptr;
  const ncclComm* comm;
  cudaStream_t stream;
};
thread_local std::vector<Scratch> tScratch;

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

}  // extern "C"
