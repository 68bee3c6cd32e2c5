// The public entry points for communication calls: argument checks (all before any state changes), then
// submit(). Each entry keeps the communicator's last-error message current and counts itself as active so
// loomCommAbort can wait for it to leave.
#include <cstring>
#include <limits>

#include "src/base/check.h"
#include "src/base/dtype.h"
#include "src/core/api_scope.h"
#include "src/core/comm.h"
#include "src/core/enqueue.h"
#include "src/core/stream.h"

using loom::Call;
using loom::Collective;

namespace loom {
namespace {

bool multiplyOverflows(size_t a, size_t b, size_t* product) { return __builtin_mul_overflow(a, b, product); }

bool overlap(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && x < y + bBytes && y < x + aBytes;
}

loomResult_t checkType(const char* what, const loomDataType_t& datatype) {
  int raw = rawValue(datatype);
  if (!dtypeValid(raw))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: unknown datatype %d (expected 0..%d)", what, raw,
                     loomNumTypes - 1);
  return loomSuccess;
}

loomResult_t checkOp(const char* what, const loomRedOp_t& op) {
  int raw = rawValue(op);
  if (!opValid(raw))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: unknown reduction op %d (expected 0..%d)", what, raw,
                     loomNumOps - 1);
  return loomSuccess;
}

loomResult_t checkRank(const char* what, const char* role, int value, int nranks) {
  if (value < 0 || value >= nranks)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: %s %d is out of range for %d ranks", what, role, value, nranks);
  return loomSuccess;
}

// Bytes of `count` elements, failing on overflow; `scale` multiplies (nranks for the big side of a call).
loomResult_t bytesOf(const char* what, size_t count, size_t scale, loomDataType_t datatype, size_t* bytes) {
  size_t elements = 0;
  if (multiplyOverflows(count, scale, &elements) || multiplyOverflows(elements, dtypeSize(datatype), bytes) ||
      *bytes > static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max()))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: count %zu x %zu elements of %s overflows the address space", what,
                     count, scale, dtypeName(datatype));
  return loomSuccess;
}

// In place means exactly `inPlaceAt`; any other overlap of the two buffers is an error.
loomResult_t checkLayout(const char* what, const void* send, size_t sendBytes, const void* recv, size_t recvBytes,
                         const void* inPlaceAt) {
  if (send == inPlaceAt && inPlaceAt != nullptr) return loomSuccess;
  if (overlap(send, sendBytes, recv, recvBytes))
    return LOOM_FAIL(loomInvalidArgument, COLL,
                     "%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap but the call is not in place "
                     "(in place needs sendbuff == %p)",
                     what, send, sendBytes, recv, recvBytes, inPlaceAt);
  return loomSuccess;
}

Call makeCall(loomComm* comm, Collective collective, size_t count, loomDataType_t datatype, loomRedOp_t op, int root,
              loomStream_t stream, const void* send, void* recv) {
  Call call;
  call.comm = comm;
  call.collective = collective;
  call.count = count;
  call.datatype = datatype;
  call.op = op;
  call.root = root;
  call.stream = stream;
  call.inputs = {send};
  call.outputs = {recv};
  return call;
}

// A zero-count call is a valid no-op: nothing is planned or synchronised.
// A call of count 0 does nothing, except under LOOM_CHECK_COLL, where the peers still compare it with theirs.
loomResult_t submitUnlessEmpty(Call&& call, bool empty) {
  if (!empty) return submit(std::move(call));
  if (!call.comm->settings.checkCalls || call.collective == Collective::kSendRecv) return loomSuccess;
  call.fingerprintOnly = true;
  return submit(std::move(call));
}

}  // namespace

loomResult_t checkComm(loomComm* comm, const char* what, loomStream_t stream) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: comm is NULL", what);
  if (comm->finalized) return LOOM_FAIL(loomInvalidUsage, COLL, "%s: the communicator was finalized", what);
  if (comm->revoked.load())
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s: the communicator was revoked (loomCommRevoke); destroy it", what);
  int pending = comm->asyncError.load();
  if (pending == loomInProgress)
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s: the communicator is still initialising (loomInProgress)", what);
  if (pending != loomSuccess)
    return LOOM_FAIL(loomInvalidUsage, COLL,
                     "%s: the communicator has a pending error (%s) from an earlier call; abort or destroy it", what,
                     loomGetErrorString(static_cast<loomResult_t>(pending)));
  if (stream != nullptr && comm->settings.device == loomDeviceHost && !isHostStream(stream))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: stream %p is neither NULL nor a stream from loomStreamCreate",
                     what, stream);
  return loomSuccess;
}

loomResult_t checkBuffer(const char* what, const char* name, const void* buffer, size_t bytes) {
  if (buffer == nullptr && bytes > 0)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: %s is NULL with a non-zero count", what, name);
  return loomSuccess;
}

}  // namespace loom

using namespace loom;

#define LOOM_API_BEGIN(comm) \
  ApiScope scope_(comm);     \
  auto body_ = [&]() -> loomResult_t {
#define LOOM_API_END \
  }                  \
  ;                  \
  return scope_.finish(body_());

loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                           loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "AllReduce";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkOp(what, op));
  size_t bytes = 0;
  LOOM_CHECK(bytesOf(what, count, 1, datatype, &bytes));
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, bytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, bytes));
  LOOM_CHECK(checkLayout(what, sendbuff, bytes, recvbuff, bytes, recvbuff));
  return submitUnlessEmpty(makeCall(comm, Collective::kAllReduce, count, datatype, op, 0, stream, sendbuff, recvbuff),
                           count == 0);
  LOOM_API_END
}

loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                           loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "Broadcast";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkRank(what, "root", root, comm->nranks));
  size_t bytes = 0;
  LOOM_CHECK(bytesOf(what, count, 1, datatype, &bytes));
  bool isRoot = comm->rank == root;
  LOOM_CHECK(checkBuffer(what, "sendbuff (on root)", isRoot ? sendbuff : nullptr, isRoot ? bytes : 0));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, bytes));
  if (isRoot) LOOM_CHECK(checkLayout(what, sendbuff, bytes, recvbuff, bytes, recvbuff));
  return submitUnlessEmpty(makeCall(comm, Collective::kBroadcast, count, datatype, loomSum, root, stream,
                                    isRoot ? sendbuff : nullptr, recvbuff),
                           count == 0);
  LOOM_API_END
}

loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                        int root, loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "Reduce";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkOp(what, op));
  LOOM_CHECK(checkRank(what, "root", root, comm->nranks));
  size_t bytes = 0;
  LOOM_CHECK(bytesOf(what, count, 1, datatype, &bytes));
  bool isRoot = comm->rank == root;
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, bytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff (on root)", isRoot ? recvbuff : nullptr, isRoot ? bytes : 0));
  if (isRoot) LOOM_CHECK(checkLayout(what, sendbuff, bytes, recvbuff, bytes, recvbuff));
  return submitUnlessEmpty(
      makeCall(comm, Collective::kReduce, count, datatype, op, root, stream, sendbuff, isRoot ? recvbuff : nullptr),
      count == 0);
  LOOM_API_END
}

loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype,
                           loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "AllGather";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  size_t bytes = 0, totalBytes = 0;
  LOOM_CHECK(bytesOf(what, sendcount, 1, datatype, &bytes));
  LOOM_CHECK(bytesOf(what, sendcount, comm->nranks, datatype, &totalBytes));
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, bytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, totalBytes));
  const void* inPlace = recvbuff ? static_cast<const char*>(recvbuff) + comm->rank * bytes : nullptr;
  LOOM_CHECK(checkLayout(what, sendbuff, bytes, recvbuff, totalBytes, inPlace));
  return submitUnlessEmpty(
      makeCall(comm, Collective::kAllGather, sendcount, datatype, loomSum, 0, stream, sendbuff, recvbuff),
      sendcount == 0);
  LOOM_API_END
}

loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype,
                               loomRedOp_t op, loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "ReduceScatter";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkOp(what, op));
  size_t bytes = 0, totalBytes = 0;
  LOOM_CHECK(bytesOf(what, recvcount, 1, datatype, &bytes));
  LOOM_CHECK(bytesOf(what, recvcount, comm->nranks, datatype, &totalBytes));
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, totalBytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, bytes));
  // In place: recvbuff == sendbuff + rank*recvcount, i.e. sendbuff == recvbuff - rank*recvcount.
  bool inPlace = sendbuff && recvbuff == static_cast<const char*>(sendbuff) + comm->rank * bytes;
  if (!inPlace) LOOM_CHECK(checkLayout(what, sendbuff, totalBytes, recvbuff, bytes, nullptr));
  return submitUnlessEmpty(
      makeCall(comm, Collective::kReduceScatter, recvcount, datatype, op, 0, stream, sendbuff, recvbuff),
      recvcount == 0);
  LOOM_API_END
}

loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm,
                          loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "AllToAll";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  size_t totalBytes = 0;
  LOOM_CHECK(bytesOf(what, count, comm->nranks, datatype, &totalBytes));
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, totalBytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, totalBytes));
  LOOM_CHECK(checkLayout(what, sendbuff, totalBytes, recvbuff, totalBytes, nullptr));
  return submitUnlessEmpty(
      makeCall(comm, Collective::kAllToAll, count, datatype, loomSum, 0, stream, sendbuff, recvbuff), count == 0);
  LOOM_API_END
}

loomResult_t loomAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                           const size_t recvcounts[], const size_t rdispls[], loomDataType_t datatype, loomComm_t comm,
                           loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "AllToAllv";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  if (!sendcounts || !sdispls || !recvcounts || !rdispls)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: sendcounts, sdispls, recvcounts and rdispls must not be NULL",
                     what);
  int n = comm->nranks;
  size_t sendEnd = 0, recvEnd = 0, total = 0;
  for (int p = 0; p < n; ++p) {
    size_t end = 0;
    if (__builtin_add_overflow(sdispls[p], sendcounts[p], &end))
      return LOOM_FAIL(loomInvalidArgument, COLL, "%s: sdispls[%d] + sendcounts[%d] overflows", what, p, p);
    if (sendcounts[p]) sendEnd = std::max(sendEnd, end);
    if (__builtin_add_overflow(rdispls[p], recvcounts[p], &end))
      return LOOM_FAIL(loomInvalidArgument, COLL, "%s: rdispls[%d] + recvcounts[%d] overflows", what, p, p);
    if (recvcounts[p]) recvEnd = std::max(recvEnd, end);
    total += sendcounts[p] + recvcounts[p];
  }
  size_t sendBytes = 0, recvBytes = 0;
  LOOM_CHECK(bytesOf(what, sendEnd, 1, datatype, &sendBytes));
  LOOM_CHECK(bytesOf(what, recvEnd, 1, datatype, &recvBytes));
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, sendBytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, recvBytes));
  LOOM_CHECK(checkLayout(what, sendbuff, sendBytes, recvbuff, recvBytes, nullptr));
  if (sendcounts[comm->rank] != recvcounts[comm->rank])
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: rank %d sends %zu elements to itself but receives %zu", what,
                     comm->rank, sendcounts[comm->rank], recvcounts[comm->rank]);
  Call call = makeCall(comm, Collective::kAllToAllv, 0, datatype, loomSum, 0, stream, sendbuff, recvbuff);
  call.sendCounts.assign(sendcounts, sendcounts + n);
  call.sendDispls.assign(sdispls, sdispls + n);
  call.recvCounts.assign(recvcounts, recvcounts + n);
  call.recvDispls.assign(rdispls, rdispls + n);
  return submitUnlessEmpty(std::move(call), total == 0);
  LOOM_API_END
}

loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype, int root,
                        loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "Gather";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkRank(what, "root", root, comm->nranks));
  size_t bytes = 0, totalBytes = 0;
  LOOM_CHECK(bytesOf(what, sendcount, 1, datatype, &bytes));
  LOOM_CHECK(bytesOf(what, sendcount, comm->nranks, datatype, &totalBytes));
  bool isRoot = comm->rank == root;
  LOOM_CHECK(checkBuffer(what, "sendbuff", sendbuff, bytes));
  LOOM_CHECK(checkBuffer(what, "recvbuff (on root)", isRoot ? recvbuff : nullptr, isRoot ? totalBytes : 0));
  if (isRoot) {
    const void* inPlace = recvbuff ? static_cast<const char*>(recvbuff) + root * bytes : nullptr;
    LOOM_CHECK(checkLayout(what, sendbuff, bytes, recvbuff, totalBytes, inPlace));
  }
  return submitUnlessEmpty(makeCall(comm, Collective::kGather, sendcount, datatype, loomSum, root, stream, sendbuff,
                                    isRoot ? recvbuff : nullptr),
                           sendcount == 0);
  LOOM_API_END
}

loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype, int root,
                         loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  const char* what = "Scatter";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkRank(what, "root", root, comm->nranks));
  size_t bytes = 0, totalBytes = 0;
  LOOM_CHECK(bytesOf(what, recvcount, 1, datatype, &bytes));
  LOOM_CHECK(bytesOf(what, recvcount, comm->nranks, datatype, &totalBytes));
  bool isRoot = comm->rank == root;
  LOOM_CHECK(checkBuffer(what, "sendbuff (on root)", isRoot ? sendbuff : nullptr, isRoot ? totalBytes : 0));
  LOOM_CHECK(checkBuffer(what, "recvbuff", recvbuff, bytes));
  if (isRoot) {
    bool inPlace = sendbuff && recvbuff == static_cast<const char*>(sendbuff) + root * bytes;
    if (!inPlace) LOOM_CHECK(checkLayout(what, sendbuff, totalBytes, recvbuff, bytes, nullptr));
  }
  return submitUnlessEmpty(makeCall(comm, Collective::kScatter, recvcount, datatype, loomSum, root, stream,
                                    isRoot ? sendbuff : nullptr, recvbuff),
                           recvcount == 0);
  LOOM_API_END
}

namespace {
loomResult_t pointToPoint(bool isSend, const void* buffer, size_t count, loomDataType_t datatype, int peer,
                          loomComm_t comm, loomStream_t stream) {
  const char* what = isSend ? "Send" : "Recv";
  LOOM_CHECK(checkComm(comm, what, stream));
  LOOM_CHECK(checkType(what, datatype));
  LOOM_CHECK(checkRank(what, "peer", peer, comm->nranks));
  size_t bytes = 0;
  LOOM_CHECK(bytesOf(what, count, 1, datatype, &bytes));
  LOOM_CHECK(checkBuffer(what, isSend ? "sendbuff" : "recvbuff", buffer, bytes));
  if (peer == comm->rank && !groupOpen())
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s to or from self (rank %d) must be inside a group with its pair", what,
                     peer);
  Call call = makeCall(comm, Collective::kSendRecv, 0, datatype, loomSum, 0, stream, isSend ? buffer : nullptr,
                       isSend ? nullptr : const_cast<void*>(buffer));
  call.p2p.push_back({isSend, peer, count});
  return submit(std::move(call));
}
}  // namespace

loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  return pointToPoint(true, sendbuff, count, datatype, peer, comm, stream);
  LOOM_API_END
}

loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  return pointToPoint(false, recvbuff, count, datatype, peer, comm, stream);
  LOOM_API_END
}

loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream) {
  LOOM_API_BEGIN(comm)
  LOOM_CHECK(checkComm(comm, "Barrier", stream));
  return submitUnlessEmpty(makeCall(comm, Collective::kBarrier, 1, loomUint8, loomMax, 0, stream, nullptr, nullptr),
                           comm->nranks == 1);
  LOOM_API_END
}

loomResult_t loomStreamCreate(loomStream_t* stream) { return streamCreate(stream); }
loomResult_t loomStreamSynchronize(loomStream_t stream) { return streamSynchronize(stream); }
loomResult_t loomStreamDestroy(loomStream_t stream) { return streamDestroy(stream); }

const char* loomGetErrorString(loomResult_t result) {
  switch (result) {
    case loomSuccess:
      return "no error";
    case loomUnhandledCudaError:
      return "unhandled cuda error";
    case loomSystemError:
      return "unhandled system error";
    case loomInternalError:
      return "internal error";
    case loomInvalidArgument:
      return "invalid argument";
    case loomInvalidUsage:
      return "invalid usage";
    case loomRemoteError:
      return "remote process exited or there was a network error";
    case loomInProgress:
      return "operation in progress";
    case loomTimeout:
      return "operation timed out";
    default:
      return "unknown result code";
  }
}

loomResult_t loomGetVersion(int* version) {
  if (version == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "version pointer is NULL");
  *version = LOOM_VERSION_CODE;
  return loomSuccess;
}
