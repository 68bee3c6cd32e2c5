// Communicator creation and teardown, its connections, and the watch every wait consults.
#include "src/core/comm.h"

#include <sched.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/base/check.h"
#include "src/base/params.h"
#include "src/core/failure.h"
#include "src/core/zero_copy.h"
#include "src/topology/discover.h"
#include "src/topology/fuse.h"
#include "src/topology/xml.h"

loomComm::~loomComm() {
  loom::stopStatusService(this);  // first: the listener thread reads the communicator's state to answer
  for (int i = extensionCount.load() - 1; i >= 0; --i) extensions[i].reset();
}

void loomComm::setLastError(const std::string& message) {
  // A peer left unanswered by a failed accept() shows up as a timeout elsewhere: name the cause with it.
  std::string text = message;
  const loom::Bootstrap* up = bootstrapUp.load();
  const std::string note = up != nullptr ? up->listenerNote() : std::string();
  // (Not when the message already names the same shortage, which the listener's would only repeat.)
  const bool sameShortage =
      note.find("open files") != std::string::npos && text.find("open files") != std::string::npos;
  if (!note.empty() && !sameShortage && text.find(note) == std::string::npos) text += note;
  std::lock_guard<std::mutex> lock(errorMutex);
  lastError = std::move(text);
}

namespace loom {
namespace {

// What every rank must agree on; exchanged at init next to PeerInfo.
struct RankSetup {
  PeerInfo info;
  uint64_t probeAddress;
  int fifoDepth;
  uint64_t slotBytes;
  uint64_t networkSlotBytes;  // what the network transports ask for where no two ranks share memory (0: none)
  uint64_t llSlotBytes;
  uint64_t llThresholdBytes;
  uint64_t chunkBytes;
  int nChannels;
  int forcedProtocol;
  char algorithm[32];      // LOOM_ALGO (its start, for the message): ranks that pick different algorithms
  uint64_t algorithmHash;  // would exchange mismatched messages; compared whole through its hash
  char torus[32];          // LOOM_TORUS_DIMS likewise
  uint64_t torusHash;
  char transports[48];      // the transports this rank would use (LOOM_TRANSPORTS, LOOM_NET or the automatic
  uint64_t transportsHash;  // choice between hosts), likewise: a sender on ib and its receiver on tcp never meet
  int cuda;                 // a CUDA communicator's rank; then the GPU executor's settings, which its CUDA ranks
  char cudaPath[16];        // must share (LOOM_CUDA_PATH, LOOM_CUDA_ONESHOT_BYTES, LOOM_CUDA_TWOSHOT_BYTES,
  uint64_t oneShotBytes, twoShotBytes;  // LOOM_CUDA_NCHANNELS, LOOM_CUDA_SLOT_BYTES)
  uint64_t cudaChannels, cudaSlotBytes;
  int checkCalls;  // LOOM_CHECK_COLL: a rank checking waits for the others to check too
  int deterministic;  // LOOM_DETERMINISTIC: the ranks must pick the same algorithms
  int checksum;       // LOOM_CHECKSUM: a message's size and layout depend on it
  char host[64];   // the host name, for error messages that name a rank
};

// The transport that connects this rank to `peer`: the first in priority order that can (null: none can).
Transport* firstTransportTo(const loomComm* comm, int peer, std::string* reasons) {
  for (Transport* candidate : transportsInPriorityOrder()) {
    std::string why;
    if (candidate->canConnect(comm->peers[comm->rank], comm->peers[peer], &why)) return candidate;
    if (reasons != nullptr) *reasons += std::string(reasons->empty() ? "" : "; ") + candidate->name() + ": " + why;
  }
  return nullptr;
}

// Whether no two ranks of the communicator would connect through a transport without a proxy (shared memory):
// then every message crosses a network, and its FIFOs take the slots the network transports ask for. Such
// transports connect ranks of one host only, by what every rank knows of every other, and the ranks' transports
// match: every rank decides alike.
bool noSharedMemory(const loomComm* comm) {
  std::unordered_map<uint64_t, std::vector<int>> hosts;
  for (int r = 0; r < comm->nranks; ++r) hosts[comm->peers[r].hostHash].push_back(r);
  for (Transport* transport : transportsInPriorityOrder()) {
    if (transport->traits().movesByProxy) continue;
    for (const auto& [host, ranks] : hosts) {
      for (size_t a = 0; a < ranks.size(); ++a) {
        for (size_t b = a + 1; b < ranks.size(); ++b) {
          std::string why;
          if (transport->canConnect(comm->peers[ranks[a]], comm->peers[ranks[b]], &why)) return false;
        }
      }
    }
  }
  return true;
}

// Collectives spin long where every thread that moves this host's data (these are all the host's ranks the
// communicator knows of, and their proxy threads where a transport has one) can have a core to itself, and yield
// early where they outnumber the cores this process may run on: a spinning executor would starve the proxy
// that brings its data.
int64_t spinPollsFor(const loomComm* comm) {
  if (params::spinCount() >= 0) return params::spinCount();
  cpu_set_t cpus;
  int cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  uint64_t machine = comm->peers[comm->rank].machineHash;
  long threadsHere = std::count_if(comm->peers.begin(), comm->peers.end(),
                                   [&](const PeerInfo& peer) { return peer.machineHash == machine; });
  if (std::any_of(comm->traitsTo.begin(), comm->traitsTo.end(),
                  [](const TransportTraits& traits) { return traits.movesByProxy; }))
    threadsHere *= 2;
  return threadsHere <= cores ? kSpinPollsDedicated : kSpinPollsShared;
}

int64_t clampParam(int64_t value, int64_t lo, int64_t hi) { return value < lo ? lo : value > hi ? hi : value; }

// A Simple slot's bytes from a setting: 4 KiB to 64 MiB, a multiple of 64.
size_t simpleSlotBytes(int64_t setting) { return static_cast<size_t>(clampParam(setting, 4096, 64 << 20)) / 64 * 64; }

// The Simple slot bytes the network transports this rank would use ask for (the smallest; 0 when any of them
// asks for none): a communicator whose every connection is a network one takes it.
size_t networkSlotBytes() {
  size_t bytes = 0;
  for (Transport* transport : transportsInPriorityOrder()) {
    const TransportTraits traits = transport->traits();
    if (!traits.movesByProxy) continue;
    size_t asked = traits.networkSlotBytes;
    if (asked == 0) return 0;
    size_t slot = simpleSlotBytes(static_cast<int64_t>(asked));
    bytes = bytes == 0 ? slot : std::min(bytes, slot);
  }
  return bytes;
}

}  // namespace

loomResult_t commConfigure(loomComm* comm, int nranks, int rank, const loomConfig_t* config) {
  comm->rank = rank;
  comm->nranks = nranks;
  std::string why;
  if (!params::check(&why)) return LOOM_FAIL(loomInvalidArgument, INIT, "%s", why.c_str());
  comm->settings.timeoutMs = params::timeoutMs();
  static_assert(kMaxChannels == 32, "LOOM_NCHANNELS accepts 1..32 in params.def");
  comm->settings.nChannels = static_cast<int>(params::nChannels());
  comm->settings.algorithm = params::algo();
  if (!parseAlgorithmRules(comm->settings.algorithm, &comm->settings.algorithmRules, &why))
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_ALGO=\"%s\": %s", comm->settings.algorithm.c_str(), why.c_str());
  comm->settings.torusText = params::torusDims();
  if (!comm->settings.torusText.empty() && !parseTorusDims(comm->settings.torusText, nranks, comm->settings.torusDims, &comm->settings.torusDimCount, &why))
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_TORUS_DIMS=\"%s\": %s", comm->settings.torusText.c_str(), why.c_str());
  if (netChoiceError(&why)) return LOOM_FAIL(loomInvalidArgument, INIT, "%s", why.c_str());
  comm->settings.forcedProtocol = forcedProtocolSetting();
  comm->settings.llThresholdBytes = static_cast<size_t>(params::llThreshold());
  comm->settings.chunkBytes = static_cast<size_t>(params::chunkBytes());
  comm->settings.peerCheckMs = params::peerCheckMs();
  comm->settings.streamingBytes = static_cast<size_t>(params::streamingBytes());
  comm->settings.directForwardBytes = static_cast<size_t>(params::directForwardBytes());
  comm->settings.checkCalls = params::checkColl() != 0;
  comm->settings.deterministic = params::deterministic() != 0;
  comm->settings.checksum = params::checksum() != 0;
  comm->settings.checksumResend = params::checksum() == 2;
  if (config != nullptr) {
    if (config->timeoutMs != LOOM_CONFIG_UNDEF_INT && config->timeoutMs > 0) comm->settings.timeoutMs = config->timeoutMs;
    if (config->commName != nullptr) comm->settings.name = config->commName;
    if (config->nChannels != LOOM_CONFIG_UNDEF_INT)
      comm->settings.nChannels = static_cast<int>(clampParam(config->nChannels, 1, kMaxChannels));
    if (config->deterministic != LOOM_CONFIG_UNDEF_INT) {
      if (config->deterministic != 0 && config->deterministic != 1)
        return LOOM_FAIL(loomInvalidArgument, INIT, "config deterministic %d is neither 0 nor 1", config->deterministic);
      comm->settings.deterministic = config->deterministic == 1;
    }
    if (config->device != LOOM_CONFIG_UNDEF_INT) {
      if (config->device != loomDeviceHost && config->device != loomDeviceCuda)
        return LOOM_FAIL(loomInvalidArgument, INIT,
                         "config device %d is neither loomDeviceHost (0) nor "
                         "loomDeviceCuda (1)",
                         config->device);
      comm->settings.device = static_cast<loomDevice_t>(config->device);
    }
  }
  if (comm->settings.deterministic) {
    if (!restrictToRankOrder(&comm->settings.algorithmRules, nranks, &why))
      return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_ALGO=\"%s\" with LOOM_DETERMINISTIC: %s",
                       comm->settings.algorithm.c_str(), why.c_str());
    if (comm->rank == 0 && nranks > 2)
      LOOM_INFO(TUNE,
                "LOOM_DETERMINISTIC: reductions in rank order; AllReduce uses %s, ReduceScatter %s, Reduce %s (the "
                "other algorithms group the ranks' operands differently by count, channels or position)",
                rankOrderAlgorithms(Collective::kAllReduce).c_str(),
                rankOrderAlgorithms(Collective::kReduceScatter).c_str(),
                rankOrderAlgorithms(Collective::kReduce).c_str());
  }
  if (comm->settings.device == loomDeviceCuda)
    LOOM_CHECK(cudaCommAttach(comm, config != nullptr ? config->cudaDevice : LOOM_CONFIG_UNDEF_INT));
  return loomSuccess;
}

namespace {

// Each rank's network device, as its transport to other hosts chose it, into the topology (Topology::setRankNic).
// Only where some peer is reached over the network (every rank then has one: the ranks share their transports'
// list), so a communicator within a host pays nothing for it at init.
loomResult_t recordNics(loomComm* comm, const Deadline& deadline) {
  if (std::none_of(comm->traitsTo.begin(), comm->traitsTo.end(),
                   [](const TransportTraits& traits) { return traits.movesByProxy; }))
    return loomSuccess;
  constexpr size_t kNameBytes = 64;
  std::vector<char> names(kNameBytes * comm->nranks, '\0');
  for (const auto& [transport, state] : comm->transportComms) {
    std::string device = state != nullptr ? state->netDevice() : "";
    if (device.empty()) continue;
    std::strncpy(names.data() + kNameBytes * comm->rank, device.c_str(), kNameBytes - 1);
    break;
  }
  LOOM_CHECK(comm->bootstrap->allGather(names.data(), kNameBytes, deadline.remainingMs()));
  for (int r = 0; r < comm->nranks; ++r) {
    std::string device(names.data() + kNameBytes * r, strnlen(names.data() + kNameBytes * r, kNameBytes));
    comm->topology.setRankNic(r, device);
    if (r == comm->rank && !device.empty()) {
      int nic = comm->topology.rankNic(r);
      LOOM_INFO(TOPO, "rank %d reaches other hosts through %s (%s)", r, device.c_str(),
                nic < 0 ? "no NIC of the topology lists it" : comm->topology.node(nic).name.c_str());
    }
  }
  return loomSuccess;
}

// Every rank's local view (LOOM_TOPO_FILE or discovery), exchanged as XML and fused into the communicator's.
loomResult_t buildTopology(loomComm* comm, const std::vector<uint64_t>& hostHashes, const Deadline& deadline) {
  Topology local;
  LOOM_CHECK(loadLocalTopology(LocalPlacement{comm->rank, ""}, &local));
  std::string mine = topologyToXml(local);
  std::vector<uint64_t> sizes(comm->nranks);
  sizes[comm->rank] = mine.size();
  LOOM_CHECK(comm->bootstrap->allGather(sizes.data(), sizeof(uint64_t), deadline.remainingMs()));
  size_t widest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> all(widest * comm->nranks);
  std::memcpy(all.data() + widest * comm->rank, mine.data(), mine.size());
  LOOM_CHECK(comm->bootstrap->allGather(all.data(), widest, deadline.remainingMs()));
  std::vector<Topology> views(comm->nranks);
  for (int r = 0; r < comm->nranks; ++r) {
    std::string error;
    if (!parseTopologyXml(std::string_view(all.data() + widest * r, sizes[r]), &views[r], &error))
      return LOOM_FAIL(loomRemoteError, TOPO, "rank %d sent a topology that does not parse: %s", r, error.c_str());
  }
  LOOM_CHECK(fuseViews(views, hostHashes, &comm->topology));
  LOOM_INFO(TOPO, "comm %s: %d host(s), %d nodes, %d links for %d ranks", comm->settings.name.c_str(),
            comm->topology.hostCount(), comm->topology.nodeCount(), comm->topology.linkCount(),
            comm->topology.rankCount());
  return loomSuccess;
}

}  // namespace

loomResult_t commConnect(loomComm* comm, const loomUniqueId& id) {
  int rank = comm->rank, nranks = comm->nranks;
  ScopedLogRank logRank(rank);
  Deadline deadline(comm->settings.timeoutMs);
  LOOM_CHECK(Bootstrap::create(id, rank, nranks, deadline, &comm->abortFlag, &comm->bootstrap));
  comm->bootstrapUp.store(comm->bootstrap.get());
  startStatusService(comm);
  comm->commHash = comm->bootstrap->commHash();
  static_assert(kMaxFifoDepth == 64, "LOOM_FIFO_DEPTH accepts 2..64 in params.def");
  comm->settings.fifoShape = {static_cast<int>(params::fifoDepth()), simpleSlotBytes(params::simpleSlotBytes()),
                              static_cast<size_t>(params::llSlotBytes()) / 64 * 64};

  std::vector<RankSetup> setups(nranks);
  RankSetup& mine = setups[rank];
  std::memset(&mine, 0, sizeof(mine));
  mine.info = {rank, static_cast<int>(getpid()), localHostHash(), machineHash()};
  mine.fifoDepth = comm->settings.fifoShape.depth;
  mine.slotBytes = comm->settings.fifoShape.slotBytes;
  mine.networkSlotBytes = networkSlotBytes();
  mine.llSlotBytes = comm->settings.fifoShape.llSlotBytes;
  mine.nChannels = comm->settings.nChannels;
  mine.llThresholdBytes = comm->settings.llThresholdBytes;
  mine.chunkBytes = comm->settings.chunkBytes;
  mine.forcedProtocol = comm->settings.forcedProtocol;
  snprintf(mine.algorithm, sizeof(mine.algorithm), "%s", comm->settings.algorithm.c_str());
  mine.algorithmHash = std::hash<std::string>{}(comm->settings.algorithm);
  snprintf(mine.torus, sizeof(mine.torus), "%s", comm->settings.torusText.c_str());
  mine.torusHash = std::hash<std::string>{}(comm->settings.torusText);
  std::string transports;
  for (Transport* transport : transportsInPriorityOrder())
    transports += (transports.empty() ? "" : ",") + std::string(transport->name());
  snprintf(mine.transports, sizeof(mine.transports), "%s", transports.c_str());
  mine.transportsHash = std::hash<std::string>{}(transports);
  mine.probeAddress = directProbeAddress();
  mine.checkCalls = comm->settings.checkCalls ? 1 : 0;
  mine.deterministic = comm->settings.deterministic ? 1 : 0;
  mine.checksum = comm->settings.checksumResend ? 2 : comm->settings.checksum ? 1 : 0;
  if (gethostname(mine.host, sizeof(mine.host)) != 0) snprintf(mine.host, sizeof(mine.host), "unknown");
  mine.host[sizeof(mine.host) - 1] = '\0';
  if (comm->settings.device == loomDeviceCuda) {
    mine.cuda = 1;
    snprintf(mine.cudaPath, sizeof(mine.cudaPath), "%s", params::cudaPath().c_str());
    mine.oneShotBytes = static_cast<uint64_t>(params::cudaOneShotBytes());
    mine.twoShotBytes = static_cast<uint64_t>(params::cudaTwoShotBytes());
    mine.cudaChannels = static_cast<uint64_t>(params::cudaNChannels());
    mine.cudaSlotBytes = static_cast<uint64_t>(params::cudaSlotBytes());
  }
  LOOM_CHECK(comm->bootstrap->allGather(setups.data(), sizeof(RankSetup), deadline.remainingMs()));
  comm->everyRankCuda = true;
  for (const RankSetup& setup : setups) {
    if (setup.algorithmHash != mine.algorithmHash)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d uses LOOM_ALGO=\"%.32s\", rank %d uses \"%.32s\": LOOM_ALGO must match on every rank",
                       setup.info.rank, setup.algorithm, rank, mine.algorithm);
    if (setup.checkCalls != mine.checkCalls)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d has LOOM_CHECK_COLL=%d, rank %d %d: it must match on every rank", setup.info.rank,
                       setup.checkCalls, rank, mine.checkCalls);
    if (setup.deterministic != mine.deterministic)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d has LOOM_DETERMINISTIC=%d, rank %d %d (environment or config): it must match on every "
                       "rank",
                       setup.info.rank, setup.deterministic, rank, mine.deterministic);
    if (setup.checksum != mine.checksum)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d has LOOM_CHECKSUM=%d, rank %d %d: it must match on every rank (a checked message "
                       "carries its checksum after the payload)",
                       setup.info.rank, setup.checksum, rank, mine.checksum);
    if (setup.torusHash != mine.torusHash)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d uses LOOM_TORUS_DIMS=\"%.32s\", rank %d uses \"%.32s\": it must match on every rank",
                       setup.info.rank, setup.torus, rank, mine.torus);
    if (setup.transportsHash != mine.transportsHash)
      return LOOM_FAIL(
          loomInvalidUsage, INIT,
          "rank %d would use the transports %.48s, rank %d %.48s: set LOOM_NET (or LOOM_TRANSPORTS) alike "
          "on every rank (without it, a rank takes ib between hosts where it has an active RDMA port, else "
          "tcp)",
          setup.info.rank, setup.transports, rank, mine.transports);
    if (setup.fifoDepth != mine.fifoDepth || setup.slotBytes != mine.slotBytes ||
        setup.networkSlotBytes != mine.networkSlotBytes || setup.llSlotBytes != mine.llSlotBytes ||
        setup.nChannels != mine.nChannels || setup.llThresholdBytes != mine.llThresholdBytes ||
        setup.forcedProtocol != mine.forcedProtocol || setup.chunkBytes != mine.chunkBytes)
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d uses FIFO depth %d, slots of %llu/%llu/%llu bytes, %d channels, LL up to %llu bytes, "
                       "protocol %d, chunks of %llu bytes; rank %d uses %d, %llu/%llu/%llu, %d, %llu, %d, %llu: "
                       "LOOM_FIFO_DEPTH, LOOM_*_SLOT_BYTES, LOOM_NCHANNELS, LOOM_LL_THRESHOLD, LOOM_PROTO and "
                       "LOOM_CHUNK_BYTES must match on every rank",
                       setup.info.rank, setup.fifoDepth, (unsigned long long)setup.slotBytes,
                       (unsigned long long)setup.networkSlotBytes, (unsigned long long)setup.llSlotBytes,
                       setup.nChannels, (unsigned long long)setup.llThresholdBytes, setup.forcedProtocol,
                       (unsigned long long)setup.chunkBytes, rank, mine.fifoDepth, (unsigned long long)mine.slotBytes,
                       (unsigned long long)mine.networkSlotBytes, (unsigned long long)mine.llSlotBytes, mine.nChannels,
                       (unsigned long long)mine.llThresholdBytes, mine.forcedProtocol,
                       (unsigned long long)mine.chunkBytes);
    if (setup.cuda && mine.cuda &&
        (std::strncmp(setup.cudaPath, mine.cudaPath, sizeof(mine.cudaPath)) != 0 ||
         setup.oneShotBytes != mine.oneShotBytes || setup.twoShotBytes != mine.twoShotBytes))
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d uses LOOM_CUDA_PATH=\"%.16s\" with one-shot and two-shot AllReduce up to %llu and %llu "
                       "bytes, rank %d \"%.16s\", %llu and %llu: LOOM_CUDA_PATH, LOOM_CUDA_ONESHOT_BYTES and "
                       "LOOM_CUDA_TWOSHOT_BYTES must match on every rank",
                       setup.info.rank, setup.cudaPath, (unsigned long long)setup.oneShotBytes,
                       (unsigned long long)setup.twoShotBytes, rank, mine.cudaPath,
                       (unsigned long long)mine.oneShotBytes, (unsigned long long)mine.twoShotBytes);
    if (setup.cuda && mine.cuda &&
        (setup.cudaChannels != mine.cudaChannels || setup.cudaSlotBytes != mine.cudaSlotBytes))
      return LOOM_FAIL(loomInvalidUsage, INIT,
                       "rank %d uses LOOM_CUDA_NCHANNELS=%llu and LOOM_CUDA_SLOT_BYTES=%llu, rank %d %llu and %llu: "
                       "they must match on every rank",
                       setup.info.rank, (unsigned long long)setup.cudaChannels,
                       (unsigned long long)setup.cudaSlotBytes, rank, (unsigned long long)mine.cudaChannels,
                       (unsigned long long)mine.cudaSlotBytes);
    comm->everyRankCuda = comm->everyRankCuda && setup.cuda;
    comm->peers.push_back(setup.info);
    comm->hostNames.emplace_back(setup.host, strnlen(setup.host, sizeof(setup.host)));
    if (setup.info.machineHash == mine.info.machineHash && setup.info.rank != rank)
      comm->peerWatch.add(setup.info.rank, setup.info.pid);
  }
  comm->connections.watchPeersWith(&comm->peerWatch, [comm](int peer) { return askFailure(comm, peer); });
  // Hosts numbered in the order of their first rank.
  std::vector<uint64_t> hosts, hostHashes;
  for (const RankSetup& setup : setups) {
    hostHashes.push_back(setup.info.hostHash);
    auto known = std::find(hosts.begin(), hosts.end(), setup.info.hostHash);
    comm->hostOf.push_back(static_cast<int>(known - hosts.begin()));
    if (known == hosts.end()) hosts.push_back(setup.info.hostHash);
  }
  LOOM_CHECK(buildTopology(comm, hostHashes, deadline));
  if (comm->settings.torusDimCount == 0) {  // the torus the topology describes, when it describes one
    std::vector<int> dims = comm->topology.torusDims();
    if (dims.size() <= static_cast<size_t>(kMaxTorusDims)) {
      comm->settings.torusDimCount = static_cast<int>(dims.size());
      std::copy(dims.begin(), dims.end(), comm->settings.torusDims);
    }
  }
  if (mine.networkSlotBytes > 0 && noSharedMemory(comm)) comm->settings.fifoShape.slotBytes = mine.networkSlotBytes;
  // Each peer's transport and what it is like (its traits), once: the direct-access probe, the spin policy, the
  // NIC record and every connection use them.
  comm->transportTo.assign(nranks, nullptr);
  comm->traitsTo.assign(nranks, TransportTraits{});
  for (int p = 0; p < nranks; ++p) {
    if (p != rank) comm->transportTo[p] = firstTransportTo(comm, p, nullptr);
    if (comm->transportTo[p] != nullptr) comm->traitsTo[p] = comm->transportTo[p]->traits();
  }
  comm->connections.setPeerTraits(comm->traitsTo);
  std::vector<DirectProbe> probes(nranks);
  for (int p = 0; p < nranks; ++p) probes[p] = {setups[p].info.pid, setups[p].info.hostHash, setups[p].probeAddress};
  LOOM_CHECK(exchangeDirectAccess(comm, probes, deadline));
  TransportCommContext context{comm->commHash,       rank, nranks, comm->bootstrap.get(), &comm->abortFlag,
                               comm->settings.timeoutMs, comm->settings.checksumResend};
  for (Transport* transport : transportsInPriorityOrder()) {
    std::unique_ptr<TransportComm> state;
    LOOM_CHECK(transport->openComm(context, &state));
    comm->transportComms.emplace_back(transport, std::move(state));
  }
  LOOM_CHECK(recordNics(comm, deadline));
  std::vector<TransportComm*> callerProgress;
  for (const auto& [transport, state] : comm->transportComms)
    if (state != nullptr && state->progressesFromCaller() &&
        std::find(comm->transportTo.begin(), comm->transportTo.end(), transport) != comm->transportTo.end())
      callerProgress.push_back(state.get());
  comm->connections.setCallerProgress(std::move(callerProgress));
  comm->connections.setWhyLost([comm](int peer) {
    for (const auto& [transport, state] : comm->transportComms)
      if (state != nullptr)
        if (std::string why = state->lostReason(peer); !why.empty()) return why;
    return std::string();
  });
  comm->settings.spinPolls = spinPollsFor(comm);
  TuneContext tune;
  tune.topology = &comm->topology;
  tune.nranks = nranks;
  tune.hostOf = comm->hostOf;
  tune.torusDimCount = comm->settings.torusDimCount;
  std::copy(comm->settings.torusDims, comm->settings.torusDims + comm->settings.torusDimCount, tune.torusDims);
  tune.nChannels = comm->settings.nChannels;
  tune.forcedProtocol = comm->settings.forcedProtocol;
  tune.llThresholdBytes = comm->settings.llThresholdBytes;
  tune.forcedChunkBytes = comm->settings.chunkBytes;
  tune.fifoDepth = comm->settings.fifoShape.depth;
  tune.llSliceBytes = slicePayloadBytes(comm->settings, Protocol::kLL);
  tune.simpleSliceBytes = slicePayloadBytes(comm->settings, Protocol::kSimple);
  comm->planner.tuner().configure(std::move(tune));
  if (comm->settings.device == loomDeviceCuda) LOOM_CHECK(cudaCommConnected(comm));
  LOOM_INFO(INIT, "comm %s rank %d of %d ready on %zu host(s) (%d channel(s), FIFO %d x %zu bytes)", comm->settings.name.c_str(),
            rank, nranks, hosts.size(), comm->settings.nChannels, comm->settings.fifoShape.depth, comm->settings.fifoShape.slotBytes);
  comm->listing.list(comm);
  return loomSuccess;
}

// No deadline of its own: every call inside the library ends by its own deadline (or at once after an abort),
// and freeing the communicator under a running call is not an option.
void waitForIdle(loomComm* comm) {
  Backoff backoff;
  while (comm->activeCalls.load() > 0) backoff.pause();
}

loomResult_t routeTo(const loomComm* comm, int peer, ConnectionTable::Route* out) {
  std::string reasons;
  out->transport = peer < static_cast<int>(comm->transportTo.size()) ? comm->transportTo[peer] : nullptr;
  out->state = nullptr;
  if (out->transport == nullptr) {
    firstTransportTo(comm, peer, &reasons);  // none can: say why, transport by transport
    if (reasons.empty()) reasons = "LOOM_TRANSPORTS=\"" + params::transports() + "\" allows no known transport";
    return LOOM_FAIL(loomSystemError, INIT, "no transport can connect rank %d to rank %d (%s)", comm->rank, peer,
                     reasons.c_str());
  }
  for (const auto& [candidate, state] : comm->transportComms)
    if (candidate == out->transport) out->state = state.get();
  return loomSuccess;
}

CommWatch::CommWatch(loomComm* comm, const char* what, uint64_t sequence)
    : comm_(comm), what_(what), sequence_(sequence), deadline_(-1) {}

loomResult_t CommWatch::operator()(bool progressed, const std::function<bool(int)>& needsPeer) {
  if (comm_->abortFlag.load(std::memory_order_relaxed)) {
    comm_->connections.noteFailure(packOrigin({comm_->rank, FailureCause::kUserAbort, 0}));
    return LOOM_FAIL(loomRemoteError, COLL, "%s on rank %d: communicator aborted", label().c_str(), comm_->rank);
  }
  if (progressed) {
    waiting_ = false;
    return loomSuccess;
  }
  if (!waiting_) {
    deadline_ = Deadline(comm_->settings.timeoutMs);
    waiting_ = true;
  }
  Clock::time_point now = Clock::now();
  if (now >= comm_->nextPeerCheck) {
    comm_->nextPeerCheck = now + std::chrono::milliseconds(comm_->settings.peerCheckMs);
    int dead = comm_->peerWatch.firstDead(needsPeer);
    if (dead >= 0) {
      // A peer that ended may have failed first of something else, and its marks say so: look at them first. A
      // network notice lands a little after the process that sent it ends, so one that ended other than by
      // SIGKILL (which no failing process sends itself) gets a moment for its marks to arrive.
      bool mayCome = false;
      const uint64_t origin = comm_->connections.marksAfterLoss(dead, &mayCome);
      if (origin == 0 && mayCome) {
        if (!deadSeen_) {
          deadSeen_ = true;
          deadSeenAt_ = now;
        }
        if (now - deadSeenAt_ < std::chrono::milliseconds(Links::kMarkGraceMs)) return loomSuccess;
      }
      comm_->connections.noteFailure(origin != 0 ? origin : packOrigin({dead, FailureCause::kGone, 0}));
      return LOOM_FAIL(loomRemoteError, COLL, "%s on rank %d: rank %d (pid %d) has ended", label().c_str(), comm_->rank, dead,
                       comm_->peers[dead].pid);
    }
    // A peer that gave up, even one this wait does not involve: the failure spreads to every rank it is connected
    // with within a peer check, instead of each waiting out its own deadline behind the others. (Not once this
    // rank has failed itself: the marks are then its own.)
    if (comm_->asyncError.load(std::memory_order_relaxed) == loomSuccess) {
      uint64_t origin = 0;
      int gaveUp = comm_->connections.firstGaveUp(&origin);
      if (gaveUp >= 0) {
        comm_->connections.noteFailure(origin != 0 ? origin : packOrigin({gaveUp, FailureCause::kUnknown, 0}));
        return LOOM_FAIL(loomRemoteError, COLL,
                         "%s on rank %d: rank %d gave up on an operation of this communicator (it failed or was "
                         "aborted)",
                         label().c_str(), comm_->rank, gaveUp);
      }
    }
  }
  if (deadline_.expired()) {
    // Which peers are not in the call, and why: named by their place in the sequence of collectives.
    const DeadlineFinding finding = findLateRanks(comm_, what_, sequence_);
    comm_->connections.noteFailure(packOrigin(finding.origin));
    return LOOM_FAIL(loomTimeout, COLL,
                     "%s on rank %d made no progress for %lld ms (LOOM_TIMEOUT_MS or config timeoutMs)%s%s",
                     label().c_str(), comm_->rank, (long long)deadline_.timeoutMs(), finding.text.empty() ? "" : "; ",
                     finding.text.empty() ? "; every peer is in the call: one may be stuck, or may not have made the "
                                            "matching call"
                                          : finding.text.c_str());
  }
  return loomSuccess;
}

std::string CommWatch::label() const {
  return sequence_ > 0 ? std::string(what_) + " #" + std::to_string(sequence_) : std::string(what_);
}

}  // namespace loom
