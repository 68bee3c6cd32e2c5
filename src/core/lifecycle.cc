// Public entry points for communicator lifecycle: unique ids, init (blocking or not), split, finalize,
// destroy, abort, and the small queries.
#include <algorithm>
#include <cstring>

#include "src/base/check.h"
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

// The options of a communicator made from `parent` (split, shrink): `config`'s, with what it leaves unset taken
// from the parent. Always blocking: the new communicator is ready when the call returns.
loomConfig_t childConfig(const loomComm* parent, const loomConfig_t* config) {
  loomConfig_t options = config ? normalisedConfig(config) : loomConfig_t(LOOM_CONFIG_INITIALIZER);
  if (options.timeoutMs == LOOM_CONFIG_UNDEF_INT) options.timeoutMs = static_cast<int>(parent->settings.timeoutMs);
  if (options.nChannels == LOOM_CONFIG_UNDEF_INT) options.nChannels = parent->settings.nChannels;
  if (options.device == LOOM_CONFIG_UNDEF_INT) options.device = parent->settings.device;
  if (options.deterministic == LOOM_CONFIG_UNDEF_INT) options.deterministic = parent->settings.deterministic ? 1 : 0;
  if (options.device == loomDeviceCuda && options.cudaDevice == LOOM_CONFIG_UNDEF_INT)
    options.cudaDevice = parent->settings.cudaDevice;
  options.blocking = 1;
  return options;
}

// Counts a call inside the library on `comm` while it lives, so that loomCommAbort waits for it to leave.
struct ActiveCall {
  explicit ActiveCall(loomComm* comm) : comm(comm) { comm->activeCalls.fetch_add(1); }
  ~ActiveCall() { comm->activeCalls.fetch_sub(1); }
  ActiveCall(const ActiveCall&) = delete;
  ActiveCall& operator=(const ActiveCall&) = delete;
  loomComm* comm;
};

// Ends every call of `comm` in flight and tells its peers, so they fail now rather than at their deadline. The
// FIFOs stay aborted: the communicator is good for nothing but destroy. `reopenBootstrap` (loomCommShrink with
// LOOM_SHRINK_ABORT) lowers the abort flag again afterwards, so that the shrink can still use the bootstrap.
void abortCallsInFlight(loomComm* comm, bool reopenBootstrap) {
  comm->abortFlag.store(true);
  cudaCommAbort(comm);
  if (comm->initThread.joinable()) comm->initThread.join();
  waitForIdle(comm);
  {
    std::lock_guard<std::mutex> lock(comm->runMutex);
    comm->connections.noteFailure(packOrigin({comm->rank, FailureCause::kUserAbort, 0}));
    comm->connections.abortAll();
  }
  if (reopenBootstrap) comm->abortFlag.store(false);
}

// What this communicator left on this host that no one else will remove (Transport::removeLeftovers): after a
// failure (a call that failed, an abort, a dead peer) only. Nothing to look for (no directory to scan) after a
// clean run, the usual destroy: every connection was then set up by both of its ends.
void removeLeftovers(loomComm* comm, bool aborting) {
  bool failed = aborting || comm->abortFlag.load() || comm->peerWatch.firstDead() >= 0;  // abort flag: revoked
  if (!failed) {
    std::lock_guard<std::mutex> lock(comm->errorMutex);
    failed = !comm->lastError.empty();
  }
  if (!failed) return;
  auto dead = [comm](int rank) {
    return rank != comm->rank && comm->peerWatch.firstDead([rank](int r) { return r == rank; }) == rank;
  };
  for (Transport* transport : transportsInPriorityOrder())
    transport->removeLeftovers(comm->commHash, comm->rank, dead);
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
  ActiveCall active(comm);
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
    result = comm->bootstrap->allGather(entries.data(), sizeof(Entry), comm->settings.timeoutMs);
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
    result = comm->bootstrap->allGather(entries.data(), sizeof(Entry), comm->settings.timeoutMs);
  }
  if (result != loomSuccess) return result;
  if (color == LOOM_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return loomSuccess;
  }
  int newRank = 0;
  while (members[newRank].rank != comm->rank) ++newRank;
  loomConfig_t options = childConfig(comm, config);
  result = loomCommInitRankConfig(newcomm, static_cast<int>(members.size()), entries[members.front().rank].id, newRank,
                                  &options);
  // The new communicator's failure is told on the parent too, where a caller looks: loomGetLastError(comm).
  if (result != loomSuccess) comm->setLastError(loomGetLastError(nullptr));
  return result;
}

// The survivors' lowest rank leads, over the parent's bootstrap, point to point, so that the excluded ranks are
// never waited on: it sends each other survivor a hash of its exclude list; each answers whether its own list
// hashes the same; the leader then sends all the verdict and, when they agree, the new communicator's id (drawn
// only then, so a refused shrink leaves no rendezvous open). So either every survivor joins the new communicator
// or every one returns loomInvalidUsage. Survivors that disagree on which rank leads wait for each other until
// their deadline: loomTimeout.
loomResult_t loomCommShrink(loomComm_t comm, const int* excludeRanksList, int excludeRanksCount, loomComm_t* newcomm,
                            loomConfig_t* config, int shrinkFlags) {
  clearThreadLastError();
  if (comm == nullptr || newcomm == nullptr)
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommShrink: comm and newcomm must not be NULL");
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
    return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommShrink: %d excluded ranks in list %p", excludeRanksCount,
                     static_cast<const void*>(excludeRanksList));
  if (shrinkFlags != LOOM_SHRINK_DEFAULT && shrinkFlags != LOOM_SHRINK_ABORT)
    return LOOM_FAIL(loomInvalidArgument, INIT,
                     "loomCommShrink: shrinkFlags 0x%x; expected LOOM_SHRINK_DEFAULT or LOOM_SHRINK_ABORT",
                     shrinkFlags);
  LOOM_CHECK(checkConfig(config));
  ScopedLogRank logRank(comm->rank);
  const int n = comm->nranks;
  std::vector<uint8_t> excluded(n, 0);
  for (int i = 0; i < excludeRanksCount; ++i) {
    int rank = excludeRanksList[i];
    if (rank < 0 || rank >= n)
      return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommShrink: excluded rank %d is out of range for %d ranks", rank,
                       n);
    if (excluded[rank]) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommShrink: rank %d is listed twice", rank);
    excluded[rank] = 1;
  }
  if (excluded[comm->rank])
    return LOOM_FAIL(loomInvalidArgument, INIT,
                     "loomCommShrink: rank %d is in its own exclude list; excluded ranks do not call loomCommShrink",
                     comm->rank);
  if (comm->finalized || comm->asyncError.load() == loomInProgress)
    return LOOM_FAIL(loomInvalidUsage, INIT, "loomCommShrink: the communicator is %s",
                     comm->finalized ? "finalized" : "still initialising");
  std::vector<int> survivors;
  for (int rank = 0; rank < n; ++rank)
    if (!excluded[rank]) survivors.push_back(rank);
  const int leader = survivors.front();
  const int newRank = static_cast<int>(std::find(survivors.begin(), survivors.end(), comm->rank) - survivors.begin());
  // FNV-1a over the exclusion map: equal lists, in whatever order, hash alike.
  uint64_t listHash = 14695981039346656037ull;
  for (uint8_t flag : excluded) listHash = (listHash ^ flag) * 1099511628211ull;

  if (shrinkFlags == LOOM_SHRINK_ABORT) abortCallsInFlight(comm, true);
  ActiveCall active(comm);
  constexpr int kShrinkTag = 0x53484b;  // "SHK": the bootstrap messages of a shrink
  struct Verdict {
    int32_t mismatch;  // the first survivor whose list differs from the leader's; -1: none
    loomUniqueId id;   // the new communicator's, when none differs
  } verdict{-1, {}};
  {
    std::lock_guard<std::mutex> lock(comm->runMutex);
    Bootstrap& bootstrap = *comm->bootstrap;
    const int64_t timeoutMs = comm->settings.timeoutMs;
    if (comm->rank == leader) {
      for (size_t i = 1; i < survivors.size(); ++i)
        LOOM_CHECK(bootstrap.send(survivors[i], kShrinkTag, &listHash, sizeof(listHash), timeoutMs));
      for (size_t i = 1; i < survivors.size(); ++i) {
        uint8_t agrees = 0;
        LOOM_CHECK(bootstrap.recv(survivors[i], kShrinkTag, &agrees, sizeof(agrees), timeoutMs));
        if (!agrees && verdict.mismatch < 0) verdict.mismatch = survivors[i];
      }
      if (verdict.mismatch < 0) LOOM_CHECK(createUniqueId(&verdict.id));
      for (size_t i = 1; i < survivors.size(); ++i)
        LOOM_CHECK(bootstrap.send(survivors[i], kShrinkTag, &verdict, sizeof(verdict), timeoutMs));
    } else {
      uint64_t leaderHash = 0;
      LOOM_CHECK(bootstrap.recv(leader, kShrinkTag, &leaderHash, sizeof(leaderHash), timeoutMs));
      uint8_t agrees = leaderHash == listHash ? 1 : 0;
      LOOM_CHECK(bootstrap.send(leader, kShrinkTag, &agrees, sizeof(agrees), timeoutMs));
      LOOM_CHECK(bootstrap.recv(leader, kShrinkTag, &verdict, sizeof(verdict), timeoutMs));
    }
  }
  const int32_t mismatch = verdict.mismatch;
  if (mismatch >= 0)
    return LOOM_FAIL(loomInvalidUsage, INIT,
                     "loomCommShrink: rank %d passed another exclude list than rank %d (the lowest rank kept); every "
                     "rank that calls it must exclude the same ranks",
                     mismatch, leader);
  loomConfig_t options = childConfig(comm, config);
  return loomCommInitRankConfig(newcomm, static_cast<int>(survivors.size()), verdict.id, newRank, &options);
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
  removeLeftovers(comm, false);
  delete comm;
  return loomSuccess;
}

loomResult_t loomCommAbort(loomComm_t comm) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommAbort: comm is NULL");
  abortCallsInFlight(comm, false);
  removeLeftovers(comm, true);
  delete comm;
  return loomSuccess;
}

loomResult_t loomCommRevoke(loomComm_t comm) {
  if (comm == nullptr) return LOOM_FAIL(loomInvalidArgument, INIT, "loomCommRevoke: comm is NULL");
  comm->revoked.store(true);  // later calls fail at their check; one already past it, at its first wait
  abortCallsInFlight(comm, false);
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
