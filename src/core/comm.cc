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
#include "src/topology/discover.h"
#include "src/topology/fuse.h"
#include "src/topology/xml.h"

loomComm::~loomComm() {
  loom::stopStatusService(this);  // first: the listener thread reads the communicator's state to answer
  for (auto& [object, detach] : dependents) detach();
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

// A word at a known address that peers read to find out whether they can read this process's memory.
const uint64_t kProbeWord = 0x6c6f6f6d2d636d61;  // "loom-cma"

// Whether this process can read `pid`'s memory with process_vm_readv (Yama or a container may forbid it).
bool canReadProcess(int pid, uint64_t probeAddress) {
  if (pid == getpid()) return true;
  uint64_t word = 0;
  iovec local{&word, sizeof(word)}, remote{reinterpret_cast<void*>(probeAddress), sizeof(word)};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(word) && word == kProbeWord;
}

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
  char cudaPath[16];        // must share (LOOM_CUDA_PATH, LOOM_CUDA_ONESHOT_BYTES, LOOM_CUDA_TWOSHOT_BYTES)
  uint64_t oneShotBytes, twoShotBytes;
  int checkCalls;  // LOOM_CHECK_COLL: a rank checking waits for the others to check too
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
    if (transport->movesByProxy()) continue;
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
  for (int peer = 0; peer < comm->nranks; ++peer) {
    Transport* transport = comm->transportTo[peer];
    if (transport != nullptr && transport->movesByProxy()) {
      threadsHere *= 2;
      break;
    }
  }
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
    if (!transport->movesByProxy()) continue;
    size_t asked = transport->networkSlotBytes();
    if (asked == 0) return 0;
    size_t slot = simpleSlotBytes(static_cast<int64_t>(asked));
    bytes = bytes == 0 ? slot : std::min(bytes, slot);
  }
  return bytes;
}

// Each rank probes which same-host peers' memory it can read, over transports that carry DirectDescriptors;
// the rows are exchanged so that every rank knows which peers may be sent them.
loomResult_t exchangeDirectAccess(loomComm* comm, const std::vector<RankSetup>& setups, const Deadline& deadline) {
  int n = comm->nranks;
  std::vector<uint8_t> canRead(static_cast<size_t>(n) * n, 0);
  bool enabled = params::direct() != 0;
  for (int p = 0; p < n && enabled; ++p) {
    Transport* transport = comm->transportTo[p];
    canRead[comm->rank * n + p] = transport != nullptr && transport->carriesDirect() &&
                                  setups[p].info.hostHash == setups[comm->rank].info.hostHash &&
                                  canReadProcess(setups[p].info.pid, setups[p].probeAddress);
  }
  LOOM_CHECK(comm->bootstrap->allGather(canRead.data(), n, deadline.remainingMs()));
  std::vector<bool> directTo(n), proxyTo(n);
  for (int p = 0; p < n; ++p) {
    directTo[p] = p != comm->rank && canRead[p * n + comm->rank];
    Transport* transport = comm->transportTo[p];
    proxyTo[p] = enabled && transport != nullptr && transport->proxySendsFromCallerMemory();
  }
  comm->connections.setDirectPeers(std::move(directTo));
  comm->connections.setProxyPeers(std::move(proxyTo));
  return loomSuccess;
}

}  // namespace

loomResult_t commConfigure(loomComm* comm, int nranks, int rank, const loomConfig_t* config) {
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeoutMs = params::timeoutMs();
  comm->nChannels = static_cast<int>(clampParam(params::nChannels(), 1, kMaxChannels));
  comm->algorithm = params::algo();
  std::string why;
  if (!parseAlgorithmRules(comm->algorithm, &comm->algorithmRules, &why))
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_ALGO=\"%s\": %s", comm->algorithm.c_str(), why.c_str());
  comm->torusText = params::torusDims();
  if (!comm->torusText.empty() && !parseTorusDims(comm->torusText, nranks, comm->torusDims, &comm->torusDimCount, &why))
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_TORUS_DIMS=\"%s\": %s", comm->torusText.c_str(), why.c_str());
  if (netChoiceError(&why)) return LOOM_FAIL(loomInvalidArgument, INIT, "%s", why.c_str());
  std::string proto = params::proto();
  if (!proto.empty() && proto != "LL" && proto != "Simple")
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_PROTO=\"%s\" is neither LL nor Simple", proto.c_str());
  comm->forcedProtocol = proto == "LL" ? static_cast<int>(Protocol::kLL) : proto == "Simple" ? 0 : -1;
  comm->llThresholdBytes = static_cast<size_t>(std::max<int64_t>(0, params::llThreshold()));
  int64_t chunk = params::chunkBytes();
  if (chunk != 0 && chunk < 1024)
    return LOOM_FAIL(loomInvalidArgument, INIT, "LOOM_CHUNK_BYTES=%lld: 0 lets the tuner choose, else at least 1024",
                     static_cast<long long>(chunk));
  comm->chunkBytes = static_cast<size_t>(chunk);
  comm->peerCheckMs = clampParam(params::peerCheckMs(), 1, 60000);
  comm->streamingBytes = static_cast<size_t>(std::max<int64_t>(0, params::streamingBytes()));
  comm->directForwardBytes = static_cast<size_t>(std::max<int64_t>(0, params::directForwardBytes()));
  comm->checkCalls = params::checkColl() != 0;
  if (config != nullptr) {
    if (config->timeoutMs != LOOM_CONFIG_UNDEF_INT && config->timeoutMs > 0) comm->timeoutMs = config->timeoutMs;
    if (config->commName != nullptr) comm->name = config->commName;
    if (config->nChannels != LOOM_CONFIG_UNDEF_INT)
      comm->nChannels = static_cast<int>(clampParam(config->nChannels, 1, kMaxChannels));
    if (config->device != LOOM_CONFIG_UNDEF_INT) {
      if (config->device != loomDeviceHost && config->device != loomDeviceCuda)
        return LOOM_FAIL(loomInvalidArgument, INIT,
                         "config device %d is neither loomDeviceHost (0) nor "
                         "loomDeviceCuda (1)",
                         config->device);
      comm->device = static_cast<loomDevice_t>(config->device);
    }
  }
  if (comm->device == loomDeviceCuda)
    LOOM_CHECK(cudaCommAttach(comm, config != nullptr ? config->cudaDevice : LOOM_CONFIG_UNDEF_INT));
  return loomSuccess;
}

namespace {

// Each rank's network device, as its transport to other hosts chose it, into the topology (Topology::setRankNic).
// Only where some peer is reached over the network (every rank then has one: the ranks share their transports'
// list), so a communicator within a host pays nothing for it at init.
loomResult_t recordNics(loomComm* comm, const Deadline& deadline) {
  if (std::none_of(comm->transportTo.begin(), comm->transportTo.end(),
                   [](const Transport* transport) { return transport != nullptr && transport->movesByProxy(); }))
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
  LOOM_INFO(TOPO, "comm %s: %d host(s), %d nodes, %d links for %d ranks", comm->name.c_str(),
            comm->topology.hostCount(), comm->topology.nodeCount(), comm->topology.linkCount(),
            comm->topology.rankCount());
  return loomSuccess;
}

}  // namespace

loomResult_t commConnect(loomComm* comm, const loomUniqueId& id) {
  int rank = comm->rank, nranks = comm->nranks;
  ScopedLogRank logRank(rank);
  Deadline deadline(comm->timeoutMs);
  LOOM_CHECK(Bootstrap::create(id, rank, nranks, deadline, &comm->abortFlag, &comm->bootstrap));
  comm->bootstrapUp.store(comm->bootstrap.get());
  startStatusService(comm);
  comm->commHash = comm->bootstrap->commHash();
  comm->fifoShape = {static_cast<int>(clampParam(params::fifoDepth(), 2, kMaxFifoDepth)),
                     simpleSlotBytes(params::simpleSlotBytes()),
                     static_cast<size_t>(clampParam(params::llSlotBytes(), 256, 1 << 20)) / 64 * 64};

  std::vector<RankSetup> setups(nranks);
  RankSetup& mine = setups[rank];
  std::memset(&mine, 0, sizeof(mine));
  mine.info = {rank, static_cast<int>(getpid()), localHostHash(), machineHash()};
  mine.fifoDepth = comm->fifoShape.depth;
  mine.slotBytes = comm->fifoShape.slotBytes;
  mine.networkSlotBytes = networkSlotBytes();
  mine.llSlotBytes = comm->fifoShape.llSlotBytes;
  mine.nChannels = comm->nChannels;
  mine.llThresholdBytes = comm->llThresholdBytes;
  mine.chunkBytes = comm->chunkBytes;
  mine.forcedProtocol = comm->forcedProtocol;
  snprintf(mine.algorithm, sizeof(mine.algorithm), "%s", comm->algorithm.c_str());
  mine.algorithmHash = std::hash<std::string>{}(comm->algorithm);
  snprintf(mine.torus, sizeof(mine.torus), "%s", comm->torusText.c_str());
  mine.torusHash = std::hash<std::string>{}(comm->torusText);
  std::string transports;
  for (Transport* transport : transportsInPriorityOrder())
    transports += (transports.empty() ? "" : ",") + std::string(transport->name());
  snprintf(mine.transports, sizeof(mine.transports), "%s", transports.c_str());
  mine.transportsHash = std::hash<std::string>{}(transports);
  mine.probeAddress = reinterpret_cast<uint64_t>(&kProbeWord);
  mine.checkCalls = comm->checkCalls ? 1 : 0;
  if (gethostname(mine.host, sizeof(mine.host)) != 0) snprintf(mine.host, sizeof(mine.host), "unknown");
  mine.host[sizeof(mine.host) - 1] = '\0';
  if (comm->cuda) {
    mine.cuda = 1;
    snprintf(mine.cudaPath, sizeof(mine.cudaPath), "%s", params::cudaPath().c_str());
    mine.oneShotBytes = static_cast<uint64_t>(params::cudaOneShotBytes());
    mine.twoShotBytes = static_cast<uint64_t>(params::cudaTwoShotBytes());
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
  if (comm->torusDimCount == 0) {  // the torus the topology describes, when it describes one
    std::vector<int> dims = comm->topology.torusDims();
    if (dims.size() <= static_cast<size_t>(kMaxTorusDims)) {
      comm->torusDimCount = static_cast<int>(dims.size());
      std::copy(dims.begin(), dims.end(), comm->torusDims);
    }
  }
  if (mine.networkSlotBytes > 0 && noSharedMemory(comm)) comm->fifoShape.slotBytes = mine.networkSlotBytes;
  // Each peer's transport, once: the direct-access probe, the spin policy and every connection use it.
  comm->transportTo.assign(nranks, nullptr);
  for (int p = 0; p < nranks; ++p)
    if (p != rank) comm->transportTo[p] = firstTransportTo(comm, p, nullptr);
  LOOM_CHECK(exchangeDirectAccess(comm, setups, deadline));
  TransportCommContext context{comm->commHash, rank, nranks, comm->bootstrap.get(), &comm->abortFlag, comm->timeoutMs};
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
  comm->spinPolls = spinPollsFor(comm);
  TuneContext tune;
  tune.topology = &comm->topology;
  tune.nranks = nranks;
  tune.hostOf = comm->hostOf;
  tune.torusDimCount = comm->torusDimCount;
  std::copy(comm->torusDims, comm->torusDims + comm->torusDimCount, tune.torusDims);
  tune.nChannels = comm->nChannels;
  tune.forcedProtocol = comm->forcedProtocol;
  tune.llThresholdBytes = comm->llThresholdBytes;
  tune.forcedChunkBytes = comm->chunkBytes;
  tune.llSliceBytes = fifoPayloadBytes(comm->fifoShape, Protocol::kLL);
  tune.simpleSliceBytes = fifoPayloadBytes(comm->fifoShape, Protocol::kSimple);
  comm->tuner.configure(std::move(tune));
  if (comm->cuda) LOOM_CHECK(cudaCommConnected(comm));
  LOOM_INFO(INIT, "comm %s rank %d of %d ready on %zu host(s) (%d channel(s), FIFO %d x %zu bytes)", comm->name.c_str(),
            rank, nranks, hosts.size(), comm->nChannels, comm->fifoShape.depth, comm->fifoShape.slotBytes);
  comm->listing.list(comm);
  return loomSuccess;
}

// No deadline of its own: every call inside the library ends by its own deadline (or at once after an abort),
// and freeing the communicator under a running call is not an option.
void waitForIdle(loomComm* comm) {
  Backoff backoff;
  while (comm->activeCalls.load() > 0) backoff.pause();
}

loomResult_t Connections::pickTransport(loomComm* comm, int peer, Transport** transport) {
  std::string reasons;
  *transport = peer < static_cast<int>(comm->transportTo.size()) ? comm->transportTo[peer] : nullptr;
  if (*transport != nullptr) return loomSuccess;
  firstTransportTo(comm, peer, &reasons);  // none can: say why, transport by transport
  if (reasons.empty()) reasons = "LOOM_TRANSPORTS=\"" + params::transports() + "\" allows no known transport";
  return LOOM_FAIL(loomSystemError, INIT, "no transport can connect rank %d to rank %d (%s)", comm->rank, peer,
                   reasons.c_str());
}

static TransportComm* transportCommOf(const loomComm* comm, const Transport* transport) {
  for (const auto& [candidate, state] : comm->transportComms)
    if (candidate == transport) return state.get();
  return nullptr;
}

loomResult_t Connections::createReceivers(loomComm* comm, const RankPlan& plan) {
  for (const Lane& lane : plan.lanes) {
    for (const Step& step : lane.steps) {
      if (!actionReceives(step.action) || receivers_.count({step.recvPeer, lane.channel})) continue;
      Transport* transport = nullptr;
      LOOM_CHECK(pickTransport(comm, step.recvPeer, &transport));
      Link<FifoReceiver> link;
      ConnectionKey key{comm->commHash, step.recvPeer, comm->rank, lane.channel};
      LOOM_CHECK(transport->createReceiver(transportCommOf(comm, transport), key, comm->fifoShape, &link.endpoint));
      link.end = std::make_unique<FifoReceiver>(link.endpoint->fifo());
      nranks_ = comm->nranks;
      remember(receiverTable_, tableIndex(step.recvPeer, lane.channel), link.end.get());
      receivers_[{step.recvPeer, lane.channel}] = std::move(link);
    }
  }
  return loomSuccess;
}

loomResult_t Connections::attachSenders(loomComm* comm, const RankPlan& plan, const WaitCheck& check) {
  for (const Lane& lane : plan.lanes) {
    for (const Step& step : lane.steps) {
      if (!actionSends(step.action) || senders_.count({step.sendPeer, lane.channel})) continue;
      Transport* transport = nullptr;
      LOOM_CHECK(pickTransport(comm, step.sendPeer, &transport));
      Link<FifoSender> link;
      ConnectionKey key{comm->commHash, comm->rank, step.sendPeer, lane.channel};
      loomResult_t result =
          transport->attachSender(transportCommOf(comm, transport), key, comm->fifoShape, check, &link.endpoint);
      if (result != loomSuccess) {
        std::string why = threadLastError();
        // The peer never set up its end: it has not entered the call, or it is stopped or gone (noteFailure
        // refines that), or its connection failed.
        if (result == loomTimeout || result == loomRemoteError || result == loomSystemError) {
          // A peer that closed on us mid-setup may have failed first of something else: its marks (or those of
          // the ranks that failed with it) get their moment to arrive, as in a run (no run moves them here).
          bool mayCome = false;
          uint64_t marked = marksAfterLoss(step.sendPeer, &mayCome);
          const Clock::time_point until = Clock::now() + std::chrono::milliseconds(kMarkGraceMs);
          while (marked == 0 && mayCome && Clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            marked = marksAfterLoss(step.sendPeer, &mayCome);
          }
          noteFailure(marked != 0 ? marked
                                  : packOrigin({step.sendPeer,
                                                result == loomTimeout ? FailureCause::kLate
                                                                      : FailureCause::kConnectionLost,
                                                0}));
        }
        return LOOM_FAIL(result, INIT, "%s; waiting for rank %d to set up its end of channel %d (%s)", why.c_str(),
                         step.sendPeer, lane.channel, transport->name());
      }
      link.end = std::make_unique<FifoSender>(link.endpoint->fifo());
      LOOM_TRACE(INIT, "connected to rank %d on channel %d via %s", step.sendPeer, lane.channel, transport->name());
      nranks_ = comm->nranks;
      remember(senderTable_, tableIndex(step.sendPeer, lane.channel), link.end.get());
      senders_[{step.sendPeer, lane.channel}] = std::move(link);
    }
  }
  return loomSuccess;
}

size_t Connections::tableIndex(int peer, int channel) const {
  constexpr int kCollectiveChannels = kMaxChannels * kChannelSets;
  size_t slot = channel < kP2PChannel ? static_cast<size_t>(channel) : kCollectiveChannels + (channel - kP2PChannel);
  return slot * static_cast<size_t>(nranks_) + static_cast<size_t>(peer);
}

template <typename End>
void Connections::remember(std::vector<End*>& table, size_t index, End* end) {
  if (table.size() <= index) table.resize(index + 1, nullptr);
  table[index] = end;
}

FifoSender* Connections::sender(int peer, int channel) {
  size_t index = tableIndex(peer, channel);
  return index < senderTable_.size() ? senderTable_[index] : nullptr;
}

FifoReceiver* Connections::receiver(int peer, int channel) {
  size_t index = tableIndex(peer, channel);
  return index < receiverTable_.size() ? receiverTable_[index] : nullptr;
}

CachedPlan* PlanCache::find(const PlanKeyView& key) {
  if (last_ != nullptr && key == lastKey_) return last_;
  auto found = plans_.find(key);
  if (found == plans_.end()) return nullptr;
  const PlanKey& stored = found->first;
  lastKey_ = {std::get<0>(stored), std::get<1>(stored), std::get<2>(stored), std::get<3>(stored), std::get<4>(stored)};
  last_ = &found->second;
  return last_;
}

CachedPlan* PlanCache::insert(PlanKey key, RankPlan plan) {
  return &plans_.insert_or_assign(std::move(key), CachedPlan{std::move(plan), false}).first->second;
}

void Connections::abortAll() {
  const uint64_t origin = failure();
  for (auto& [key, link] : senders_) link.end->abort(origin);
  for (auto& [key, link] : receivers_) link.end->abort(origin);
}

int Connections::firstGaveUp(uint64_t* origin) const {
  auto firstIn = [origin](const auto& links) {
    for (const auto& [key, link] : links) {
      if (link.end->abortCode() != kAbortedByPeer) continue;
      *origin = link.end->abortOrigin();
      return key.first;
    }
    return -1;
  };
  const int sender = firstIn(senders_);
  return sender >= 0 ? sender : firstIn(receivers_);
}

uint64_t Connections::marksAfterLoss(int peer, bool* mayCome) {
  uint64_t origin = 0;
  firstGaveUp(&origin);
  // No failing process sends itself SIGKILL: a peer that ended so failed first, and no mark of its is coming.
  int detail = 0;
  *mayCome = !(peerWatch_ != nullptr && peerWatch_->state(peer, &detail) == PeerWatch::State::kKilled &&
               detail == SIGKILL);
  return origin;
}

uint64_t Connections::noteFailure(uint64_t packed) {
  FailureOrigin origin = unpackOrigin(packed);
  // Only what another rank saw from afar is refined: a rank's own account (its deadline, its error, its abort)
  // stays, even if its process has ended since.
  const bool seenFromAfar = origin.cause == FailureCause::kUnknown || origin.cause == FailureCause::kConnectionLost ||
                            origin.cause == FailureCause::kNoAnswer || origin.cause == FailureCause::kLate ||
                            origin.cause == FailureCause::kGone;
  if (peerWatch_ != nullptr && origin.rank >= 0 && seenFromAfar) {
    int detail = 0;
    switch (peerWatch_->state(origin.rank, &detail)) {
      case PeerWatch::State::kRunning:
        // A peer that gave up without its notice getting through (a tcp sender in the middle of a message) looks
        // like a lost connection: it says why itself while it is still there.
        if ((origin.cause == FailureCause::kConnectionLost || origin.cause == FailureCause::kUnknown) && askPeer_) {
          const uint64_t told = askPeer_(origin.rank);
          if (told != 0) return Links::noteFailure(told);
        }
        break;
      case PeerWatch::State::kStopped:
        origin.cause = FailureCause::kStopped;
        origin.detail = 0;
        break;
      case PeerWatch::State::kExited:
        origin.cause = FailureCause::kExited;
        origin.detail = static_cast<uint8_t>(detail);
        break;
      case PeerWatch::State::kKilled:
        origin.cause = FailureCause::kKilled;
        origin.detail = static_cast<uint8_t>(detail);
        break;
      case PeerWatch::State::kGone:
        // Said more precisely by whoever saw it end, if anyone did.
        if (origin.cause != FailureCause::kExited && origin.cause != FailureCause::kKilled)
          origin.cause = FailureCause::kGone;
        break;
    }
  }
  return Links::noteFailure(packOrigin(origin));
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
    deadline_ = Deadline(comm_->timeoutMs);
    waiting_ = true;
  }
  Clock::time_point now = Clock::now();
  if (now >= comm_->nextPeerCheck) {
    comm_->nextPeerCheck = now + std::chrono::milliseconds(comm_->peerCheckMs);
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
