// The public entry points of loom_ep.h: argument checks (all before any state changes), then the mode's code.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "src/core/api_scope.h"
#include "src/core/stream.h"
#include "src/ep/ep.h"
#include "src/ep/low_latency.h"

using loom::ApiScope;

loomEp::loomEp() = default;
loomEp::~loomEp() = default;

namespace loom::ep {

// The EP objects of one communicator, its extension (loomComm::extension): which slots are taken, how many were
// made (each one's id), and the objects alive, which let go of the communicator (and of their windows and
// connections) when it goes first. Changed under the communicator's runMutex.
struct EpRegistry final : CommExtension {
  uint32_t slotsInUse = 0;  // a bit per EP object alive
  uint32_t objectsMade = 0;
  std::set<loomEp*> objects;
  ~EpRegistry() override {
    for (loomEp* object : objects) {
      object->lowLatency.reset();
      object->comm = nullptr;
    }
  }
};

namespace {

loomResult_t checkEp(const loomEp* ep, const char* what) {
  if (ep == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: ep is NULL", what);
  if (ep->magic != loomEp::kMagic)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: ep %p is not an EP object from loomEpCreate", what,
                     static_cast<const void*>(ep));
  return loomSuccess;
}

// An object whose communicator was destroyed or aborted: only loomEpDestroy and loomEpGetStats still work.
loomResult_t checkAttached(const loomEp* ep, const char* what) {
  if (ep->comm == nullptr)
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s: the EP object's communicator was destroyed; destroy the object",
                     what);
  return loomSuccess;
}

// The fields every rank must agree on, as gathered for the comparison.
struct ConfigImage {
  int32_t maxTokens, hidden, numExperts, topk, datatype, mode, capacity, drop;
};

ConfigImage imageOf(const loomEpConfig_t& c) {
  return {c.maxTokensPerRank,           c.hidden,         c.numExperts,  c.topk, static_cast<int32_t>(c.datatype),
          static_cast<int32_t>(c.mode), c.expertCapacity, c.dropOverflow};
}


loomResult_t create(loomComm* comm, const loomEpConfig_t* config, loomEp_t* out) {
  const char* what = "loomEpCreate";
  LOOM_CHECK(checkComm(comm, what, nullptr));
  if (config == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: config is NULL", what);
  if (out == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: ep is NULL", what);
  if (config->size != sizeof(loomEpConfig_t))
    return LOOM_FAIL(loomInvalidArgument, COLL,
                     "%s: config->size is %zu, not sizeof(loomEpConfig_t) = %zu (start from "
                     "LOOM_EP_CONFIG_INITIALIZER)",
                     what, config->size, sizeof(loomEpConfig_t));
  if (comm->settings.device != loomDeviceHost)
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s: EP objects work on host communicators only in this version", what);
  loomEpConfig_t c;
  std::memcpy(&c, config, sizeof(c));
  Shape shape;
  std::string why;
  if (!makeShape(c, comm->nranks, comm->rank, &shape, &why))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: %s", what, why.c_str());
  // The rest holds the communicator as a call does: its bootstrap exchanges and new connections must not run beside
  // a call that a host stream's worker is running on it.
  std::lock_guard<std::mutex> lock(comm->runMutex);
  // Every rank must describe the same object: compare the configs (all ranks see a difference alike).
  std::vector<ConfigImage> images(comm->nranks);
  images[comm->rank] = imageOf(c);
  LOOM_CHECK(comm->bootstrap->allGather(images.data(), sizeof(ConfigImage), comm->settings.timeoutMs));
  for (int r = 0; r < comm->nranks; ++r)
    if (std::memcmp(&images[r], &images[comm->rank], sizeof(ConfigImage)) != 0)
      return LOOM_FAIL(loomInvalidArgument, COLL, "%s: rank %d's config differs from rank %d's", what, r, comm->rank);
  auto ep = std::make_unique<loomEp>();
  ep->comm = comm;
  ep->shape = shape;
  ep->mode = c.mode;
  EpRegistry* registry = comm->extension<EpRegistry>();
  if (registry == nullptr) registry = &comm->attach(std::make_unique<EpRegistry>());
  for (int s = 0; s < kMaxEpObjects && ep->slot < 0; ++s)
    if (!(registry->slotsInUse & (1u << s))) ep->slot = s;
  if (ep->slot < 0)
    return LOOM_FAIL(loomInvalidUsage, COLL, "%s: communicator %s already has %d EP objects; destroy one first", what,
                     comm->settings.name.c_str(), kMaxEpObjects);
  const uint32_t id = ++registry->objectsMade;
  if (c.mode == loomEpLowLatency) {
    LOOM_CHECK(LowLatency::create(comm, shape, id, kEpChannel + ep->slot, &ep->lowLatency));
    ep->stats.bufferBytes = ep->lowLatency->windowBytes();
  } else {
    // Hierarchical hops where they save anything: several hosts, one of them with several ranks.
    ep->hosts = hostsOf(comm->hostOf, comm->nranks);
    ep->hierarchical = ep->hosts.count > 1 && std::any_of(ep->hosts.members.begin(), ep->hosts.members.end(),
                                                          [](const std::vector<int>& ranks) { return ranks.size() > 1; });
  }
  registry->slotsInUse |= 1u << ep->slot;
  registry->objects.insert(ep.get());
  LOOM_INFO(COLL, "EP object %u: %s mode%s, %d experts (%d per rank), top-%d, hidden %d, %d tokens per rank", id,
            c.mode == loomEpLowLatency ? "low-latency" : "normal", ep->hierarchical ? " (hierarchical)" : "",
            shape.numExperts, shape.localExperts, shape.topk, shape.hidden, shape.maxTokens);
  *out = ep.release();
  return loomSuccess;
}

// Checks shared by dispatch and combine, then orders the call after what the host stream holds.
loomResult_t begin(loomEp* ep, const char* what, loomStream_t stream) {
  LOOM_CHECK(checkComm(ep->comm, what, stream));
  if (stream != nullptr) LOOM_CHECK(loomStreamSynchronize(stream));
  return loomSuccess;
}

loomResult_t dispatch(loomEp* ep, const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                      void* recvX, int* counts, loomEpHandle_t* handleOut, loomStream_t stream) {
  const char* what = "loomEpDispatch";
  const Shape& shape = ep->shape;
  if (handleOut == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: handleOut is NULL", what);
  if (numTokens < 0 || numTokens > shape.maxTokens)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: numTokens %d is outside 0..%d (maxTokensPerRank)", what, numTokens,
                     shape.maxTokens);
  size_t tokens = static_cast<size_t>(numTokens);
  LOOM_CHECK(checkBuffer(what, "x", x, tokens * shape.rowBytes()));
  LOOM_CHECK(checkBuffer(what, "topkIdx", topkIdx, tokens * shape.topk));
  LOOM_CHECK(checkBuffer(what, "topkWeights", topkWeights, tokens * shape.topk));
  LOOM_CHECK(checkBuffer(what, "recvX", recvX, 1));
  LOOM_CHECK(checkBuffer(what, "recvTokenCountsPerLocalExpert", counts, 1));
  std::string why;
  if (!checkRouting(shape, numTokens, topkIdx, topkWeights, &why))
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: %s", what, why.c_str());
  LOOM_CHECK(begin(ep, what, stream));
  auto handle = std::make_unique<loomEpHandle>();
  handle->ep = ep;
  handle->numTokens = numTokens;
  ep->stats.lastDroppedRows = 0;
  loomResult_t result;
  if (ep->lowLatency) {
    std::lock_guard<std::mutex> lock(ep->comm->runMutex);
    result = ep->lowLatency->dispatch(x, numTokens, topkIdx, topkWeights, recvX, counts, &handle->routing,
                                      &ep->stats.bytesSent, &ep->stats.lastDroppedRows);
  } else {
    result = normalDispatch(ep, x, numTokens, topkIdx, topkWeights, recvX, counts, &handle->routing);
  }
  ++ep->stats.dispatches;
  ep->stats.droppedRows += ep->stats.lastDroppedRows;
  if (result != loomSuccess) return result;
  *handleOut = handle.release();
  return loomSuccess;
}

loomResult_t combine(loomEp* ep, const void* expertOut, loomEpHandle_t handle, void* out, loomStream_t stream) {
  const char* what = "loomEpCombine";
  if (handle == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "%s: handle is NULL", what);
  if (handle->magic != loomEpHandle::kMagic || handle->ep != ep)
    return LOOM_FAIL(loomInvalidArgument, COLL, "%s: handle %p is not a handle of this EP object's dispatch", what,
                     static_cast<const void*>(handle));
  LOOM_CHECK(checkBuffer(what, "out", out, static_cast<size_t>(handle->numTokens) * ep->shape.rowBytes()));
  LOOM_CHECK(checkBuffer(what, "expertOut", expertOut, handle->routing.dests.size()));
  LOOM_CHECK(begin(ep, what, stream));
  loomResult_t result;
  if (ep->lowLatency) {
    std::lock_guard<std::mutex> lock(ep->comm->runMutex);
    result = ep->lowLatency->combine(expertOut, handle->routing, handle->numTokens, out, &ep->stats.bytesSent);
  } else {
    result = normalCombine(ep, expertOut, *handle, out);
  }
  ++ep->stats.combines;
  return result;
}

}  // namespace
}  // namespace loom::ep

using namespace loom::ep;

loomResult_t loomEpCreate(loomComm_t comm, const loomEpConfig_t* config, loomEp_t* ep) {
  ApiScope scope(comm);
  if (ep != nullptr) *ep = nullptr;
  return scope.finish(create(comm, config, ep));
}

loomResult_t loomEpDispatch(loomEp_t ep, const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                            void* recvX, int* recvTokenCountsPerLocalExpert, loomEpHandle_t* handleOut,
                            loomStream_t stream) {
  if (handleOut != nullptr) *handleOut = nullptr;
  if (checkEp(ep, "loomEpDispatch") != loomSuccess) return loomInvalidArgument;
  LOOM_CHECK(checkAttached(ep, "loomEpDispatch"));
  ApiScope scope(ep->comm);
  return scope.finish(
      dispatch(ep, x, numTokens, topkIdx, topkWeights, recvX, recvTokenCountsPerLocalExpert, handleOut, stream));
}

loomResult_t loomEpCombine(loomEp_t ep, const void* expertOut, loomEpHandle_t handle, void* out, loomStream_t stream) {
  if (checkEp(ep, "loomEpCombine") != loomSuccess) return loomInvalidArgument;
  LOOM_CHECK(checkAttached(ep, "loomEpCombine"));
  ApiScope scope(ep->comm);
  return scope.finish(combine(ep, expertOut, handle, out, stream));
}

loomResult_t loomEpHandleFree(loomEpHandle_t handle) {
  if (handle == nullptr) return loomSuccess;
  if (handle->magic != loomEpHandle::kMagic)
    return LOOM_FAIL(loomInvalidArgument, COLL, "loomEpHandleFree: %p is not a handle from loomEpDispatch",
                     static_cast<const void*>(handle));
  handle->magic = 0;
  delete handle;
  return loomSuccess;
}

loomResult_t loomEpGetStats(loomEp_t ep, loomEpStats_t* stats) {
  LOOM_CHECK(checkEp(ep, "loomEpGetStats"));
  if (stats == nullptr) return LOOM_FAIL(loomInvalidArgument, COLL, "loomEpGetStats: stats is NULL");
  *stats = ep->stats;
  return loomSuccess;
}

loomResult_t loomEpDestroy(loomEp_t ep) {
  if (ep == nullptr) return loomSuccess;
  LOOM_CHECK(checkEp(ep, "loomEpDestroy"));
  if (ep->comm != nullptr) {
    std::lock_guard<std::mutex> lock(ep->comm->runMutex);
    auto* registry = ep->comm->extension<loom::ep::EpRegistry>();
    registry->slotsInUse &= ~(1u << ep->slot);
    registry->objects.erase(ep);
  }
  ep->magic = 0;
  delete ep;
  return loomSuccess;
}
