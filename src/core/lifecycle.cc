// Public entry points for communicator lifecycle: unique ids, init (blocking or not), split, finalize,
// destroy, abort, and the small queries.
#include <algorithm>
#include <cstring>

#include "src/core/check.h"
#include "src/core/comm.h"

using namespace loom;

namespace {

loomResult_t checkConfig(const loomConfig_t* config) {
  if (config == nullptr) return loomSuccess;
  if (config->magic != LOOM_CONFIG_MAGIC || config->size < offsetof(loomConfig_t, blocking) + sizeof(int))
    return LOOM_FAIL(loomInvalidArgument, INIT,
                     "config was not initialised with LOOM_CONFIG_INITIALIZER (magic 0x%x, size %zu)", config->magic,
                     config->size);
  return loomSuccess;
}

// Fields of configs from older headers that lack them read as unset.
loomConfig_t normalisedConfig(const loomConfig_t* config) {
  loomConfig_t full = LOOM_CONFIG_INITIALIZER;
  if (config != nullptr) std::memcpy(&full, config, std::min(config->size, sizeof(full)));
  full.size = sizeof(full);
  return full;
}

}  // namespace

loomResult_t loomGetUniqueId(loomUniqueId* uniqueId) {
  clearThreadLastError();
  if (uniqueId == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "uniqueId is NULL");
  return createUniqueId(uniqueId);
}

loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank, loomConfig_t* config) {
  clearThreadLastError();
  ScopedLogRank logRank(rank);
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "comm pointer is NULL");
  if (nranks < 1) return LOOM_FAIL(loomInvalidArgument, INIT, "nranks %d must be at least 1", nranks);
  if (rank < 0 || rank >= nranks)
    return LOOM_FAIL(loomInvalidArgument, INIT, "rank %d is out of range for %d ranks", rank, nranks);
  LOOM_CHECK(checkConfig(config));
  UniqueIdInfo info;
  LOOM_CHECK(unpackUniqueId(commId, &info));
  loomConfig_t options = normalisedConfig(config);
  auto created = std::make_unique<loomComm>();
  LOOM_CHECK(commConfigure(created.get(), nranks, rank, &options));
  if (options.blocking == 0) {
    // Non-blocking: the caller gets the handle now and polls loomCommGetAsyncError for loomInProgress to end.
    loomComm* handle = created.release();
    handle->asyncError.store(loomInProgress);
    handle->initThread = std::thread([handle, commId]() {
      ScopedLogRank threadRank(handle->rank);
      loomResult_t result = commConnect(handle, commId);
      if (result != loomSuccess) handle->setLastError(threadLastError());
      handle->asyncError.store(result);
    });
    *comm = handle;
    return loomInProgress;
  }
  loomResult_t result = commConnect(created.get(), commId);
  if (result != loomSuccess) return result;
  *comm = created.release();
  return loomSuccess;
}

loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank) {
  return loomCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm, loomConfig_t* config) {
  clearThreadLastError();
  if (comm == nullptr || newcomm == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommSplit: comm and newcomm must not be NULL");
  if (color < 0 && color != LOOM_SPLIT_NOCOLOR)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommSplit: color %d must be >= 0 or LOOM_SPLIT_NOCOLOR", color);
  LOOM_CHECK(checkConfig(config));
  ScopedLogRank logRank(comm->rank);
  if (comm->finalized || comm->asyncError.load() != loomSuccess)
    return LOOM_FAIL(loomInvalidUsage, INIT, "loomCommSplit: the communicator is %s",
                     comm->finalized ? "finalized" : "not usable (pending error or still initialising)");
  // Counted as a call inside the library, so that loomCommAbort waits for it to leave.
  comm->activeCalls.fetch_add(1);
  struct ActiveGuard {
    loomComm* comm;
    ~ActiveGuard() { comm->activeCalls.fetch_sub(1); }
  } active{comm};
  struct Entry {
    int color, key, rank;
    loomUniqueId id;
  };
  int n = comm->nranks;
  std::vector<Entry> entries(n);
  std::vector<Entry> members;
  // Round 1: everyone's (color, key); round 2: the leader of each color (its lowest new rank) publishes an id.
  entries[comm->rank] = {color, key, comm->rank, {}};
  loomResult_t result;
  {
    std::lock_guard<std::mutex> lock(comm->runMutex);
    result = comm->bootstrap->allGather(entries.data(), sizeof(Entry), comm->timeoutMs);
  }
  if (result != loomSuccess) return result;
  for (const Entry& entry : entries)
    if (entry.color == color && color != LOOM_SPLIT_NOCOLOR) members.push_back(entry);
  std::stable_sort(members.begin(), members.end(),
                   [](const Entry& a, const Entry& b) { return a.key != b.key ? a.key < b.key : a.rank < b.rank; });
  bool leader = !members.empty() && members.front().rank == comm->rank;
  if (leader) LOOM_CHECK(createUniqueId(&entries[comm->rank].id));
  {
    std::lock_guard<std::mutex> lock(comm->runMutex);
    result = comm->bootstrap->allGather(entries.data(), sizeof(Entry), comm->timeoutMs);
  }
  if (result != loomSuccess) return result;
  if (color == LOOM_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return loomSuccess;
  }
  int newRank = 0;
  while (members[newRank].rank != comm->rank) ++newRank;
  loomConfig_t options = config ? normalisedConfig(config) : loomConfig_t(LOOM_CONFIG_INITIALIZER);
  if (options.timeoutMs == LOOM_CONFIG_UNDEF_INT) options.timeoutMs = static_cast<int>(comm->timeoutMs);
  if (options.nChannels == LOOM_CONFIG_UNDEF_INT) options.nChannels = comm->nChannels;
  if (options.device == LOOM_CONFIG_UNDEF_INT) options.device = comm->device;
  if (options.device == loomDeviceCuda && options.cudaDevice == LOOM_CONFIG_UNDEF_INT)
    options.cudaDevice = comm->cudaDevice;
  options.blocking = 1;
  return loomCommInitRankConfig(newcomm, static_cast<int>(members.size()), entries[members.front().rank].id, newRank,
                                &options);
}

loomResult_t loomCommFinalize(loomComm_t comm) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommFinalize: comm is NULL");
  waitForIdle(comm);
  comm->finalized = true;
  return static_cast<loomResult_t>(comm->asyncError.load() == loomInProgress ? loomSuccess : comm->asyncError.load());
}

loomResult_t loomCommDestroy(loomComm_t comm) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommDestroy: comm is NULL");
  ScopedLogRank logRank(comm->rank);
  if (comm->initThread.joinable()) comm->initThread.join();
  waitForIdle(comm);
  LOOM_INFO(SHM, "rank %d: %llu direct (zero-copy) messages sent", comm->rank,
            (unsigned long long)comm->directMessages);
  delete comm;
  return loomSuccess;
}

loomResult_t loomCommAbort(loomComm_t comm) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommAbort: comm is NULL");
  comm->abortFlag.store(true);
  cudaCommAbort(comm);
  if (comm->initThread.joinable()) comm->initThread.join();
  waitForIdle(comm);
  {
    // Tell peers waiting on this rank, so they fail now rather than at their deadline.
    std::lock_guard<std::mutex> lock(comm->runMutex);
    comm->connections.abortAll();
  }
  delete comm;
  return loomSuccess;
}

loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommGetAsyncError: comm and asyncError must not be NULL");
  cudaCommCheckKernels(comm);
  *asyncError = static_cast<loomResult_t>(comm->asyncError.load());
  return loomSuccess;
}

loomResult_t loomCommCount(const loomComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommCount: comm and count must not be NULL");
  *count = comm->nranks;
  return loomSuccess;
}

loomResult_t loomCommUserRank(const loomComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommUserRank: comm and rank must not be NULL");
  *rank = comm->rank;
  return loomSuccess;
}

const char* loomGetLastError(loomComm_t comm) {
  thread_local std::string copy;
  if (comm == nullptr) return threadLastError().c_str();
  std::lock_guard<std::mutex> lock(comm->errorMutex);
  copy = comm->lastError;
  return copy.c_str();
}
