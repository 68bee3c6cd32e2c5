// Setting up a call, building its plans, compressing them into runs (see shapes.h).
#include "tools/sim/shapes.h"

#include "src/tuner/event_timer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <unordered_map>

#include "algorithms/builders.h"

namespace loom::sim {
namespace {

// Rank `rank`'s coordinate d in the row-major system `sizes` (last fastest), and back.
struct Coordinates {
  const std::vector<int>& sizes;
  int coord(int rank, size_t d) const {
    int stride = 1;
    for (size_t e = d + 1; e < sizes.size(); ++e) stride *= sizes[e];
    return rank / stride % sizes[d];
  }
  // The peer written as per-coordinate offsets from rank (mod each size), packed as a rank number.
  int relative(int rank, int peer) const {
    if (peer < 0) return -1;
    int packed = 0;
    for (size_t d = 0; d < sizes.size(); ++d)
      packed = packed * sizes[d] + ((coord(peer, d) - coord(rank, d)) % sizes[d] + sizes[d]) % sizes[d];
    return packed;
  }
  int absolute(int rank, int relativePeer) const {
    if (relativePeer < 0) return -1;
    int peer = 0;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int stride = 1;
      for (size_t e = d + 1; e < sizes.size(); ++e) stride *= sizes[e];
      peer = peer * sizes[d] + (coord(rank, d) + relativePeer / stride % sizes[d]) % sizes[d];
    }
    return peer;
  }
};

void rewritePeers(RankShape* shape, int rank, const Coordinates& coords, bool toRelative) {
  for (LaneShape& lane : shape->lanes) {
    for (Run& run : lane.runs) {
      run.recvPeer = toRelative ? coords.relative(rank, run.recvPeer) : coords.absolute(rank, run.recvPeer);
      run.sendPeer = toRelative ? coords.relative(rank, run.sendPeer) : coords.absolute(rank, run.sendPeer);
    }
  }
}

bool sameRun(const Run& a, const Run& b) {
  return a.flags == b.flags && a.ll == b.ll && a.recvPeer == b.recvPeer && a.sendPeer == b.sendPeer &&
         a.steps == b.steps && a.slices == b.slices &&
         (a.elements > b.elements ? a.elements - b.elements : b.elements - a.elements) <= 1;
}

// Equal up to one element per step: the near-equal pieces of partCount differ by one.
bool sameLane(const LaneShape& a, const LaneShape& b, bool sameChannel) {
  if ((sameChannel && a.channel != b.channel) || a.runs.size() != b.runs.size() || a.phases.size() != b.phases.size())
    return false;
  for (size_t i = 0; i < a.runs.size(); ++i)
    if (!sameRun(a.runs[i], b.runs[i])) return false;
  for (size_t i = 0; i < a.phases.size(); ++i)
    if (a.phases[i].firstRun != b.phases[i].firstRun || a.phases[i].runCount != b.phases[i].runCount) return false;
  return true;
}

bool sameShape(const RankShape& a, const RankShape& b) {
  if (a.lanes.size() != b.lanes.size()) return false;
  for (size_t i = 0; i < a.lanes.size(); ++i)
    if (!sameLane(a.lanes[i], b.lanes[i], true)) return false;
  return true;
}

// Folds channels 1..C-1 of each channel set into channel 0 of the set when their lanes are copies of its lanes.
bool foldable(const RankShape& shape, int nChannels) {
  std::vector<std::vector<const LaneShape*>> byChannel(static_cast<size_t>(kChannelSets) * nChannels);
  for (const LaneShape& lane : shape.lanes) {
    if (lane.channel >= kChannelSets * nChannels) return false;
    byChannel[lane.channel].push_back(&lane);
  }
  for (int set = 0; set < kChannelSets; ++set) {
    const auto& first = byChannel[set * nChannels];
    for (int c = 1; c < nChannels; ++c) {
      const auto& other = byChannel[set * nChannels + c];
      if (other.size() != first.size()) return false;
      for (size_t i = 0; i < first.size(); ++i)
        if (!sameLane(*first[i], *other[i], false)) return false;
    }
  }
  return true;
}

void fold(RankShape* shape, int nChannels) {
  std::erase_if(shape->lanes, [&](const LaneShape& lane) { return lane.channel % nChannels != 0; });
  for (LaneShape& lane : shape->lanes) lane.multiplicity = nChannels;
}

void numberConnections(RankShape* shape) {
  std::unordered_map<uint64_t, uint32_t> received, sent;
  for (LaneShape& lane : shape->lanes) {
    for (Run& run : lane.runs) {
      if (run.flags & kReceives) {
        uint32_t& next = received[connectionKey(run.recvPeer, 0, lane.channel)];
        run.inOrdinal = next;
        next += run.steps;
      }
      if (run.flags & kSends) {
        uint32_t& next = sent[connectionKey(0, run.sendPeer, lane.channel)];
        run.outOrdinal = next;
        next += run.steps;
      }
    }
  }
}

int threadCount(const Params& params) {
  int threads = params.threads > 0 ? params.threads : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, threads);
}

// Runs work(rank) for every rank on the threads.
template <typename Work>
void forEachRank(int nranks, int threads, Work work) {
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int first; (first = next.fetch_add(64)) < nranks;)
      for (int rank = first; rank < std::min(nranks, first + 64); ++rank) work(rank);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, (nranks + 63) / 64); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
}

RankShape shapeOf(const CallSetup& setup, int rank) {
  RankPlan plan;
  buildPlan(setup.argsFor(rank), setup.algorithm, &plan);
  return compressPlan(plan, setup.slicing);
}

// The sample that decides symmetry: the first and last few ranks, the middle, and a spread of others.
std::vector<int> sampleRanks(int n) {
  std::vector<int> sample{0, 1, 2, 3, n / 2, n / 2 + 1, n - 2, n - 1};
  uint64_t state = 0x2545f4914f6cdd1dULL;
  for (int i = 0; i < 56; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    sample.push_back(static_cast<int>((state >> 33) % static_cast<uint64_t>(n)));
  }
  std::erase_if(sample, [&](int rank) { return rank < 0 || rank >= n; });
  std::sort(sample.begin(), sample.end());
  sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  return sample;
}

// Extends a sample of shapes to every rank when one coordinate system makes them all equal.
bool extendBySymmetry(const CallSetup& setup, const Params& params, const std::vector<int>& sample,
                      const std::vector<RankShape>& sampled, ShapeSet* shapes) {
  int n = setup.base.nranks;
  for (size_t s = 0; s < setup.symmetries.size(); ++s) {
    Coordinates coords{setup.symmetries[s]};
    std::vector<RankShape> relative = sampled;
    for (size_t i = 0; i < sample.size(); ++i) rewritePeers(&relative[i], sample[i], coords, true);
    bool same = true;
    for (size_t i = 1; i < sample.size() && same; ++i) same = sameShape(relative[0], relative[i]);
    if (!same) continue;
    shapes->ranks.assign(n, {});
    forEachRank(n, threadCount(params), [&](int rank) {
      shapes->ranks[rank] = relative[0];
      rewritePeers(&shapes->ranks[rank], rank, coords, false);
    });
    shapes->symmetry = setup.symmetryNames[s];
    return true;
  }
  return false;
}

// The payload of one LL slot: half of its bytes past the size word.
size_t llPayloadOf(const Params& params) { return params.llSlotBytes > 8 ? (params.llSlotBytes - 8) / 2 : 4; }

}  // namespace

Slicing::Slicing(const Params& params, size_t elementBytes)
    : SliceRule(SliceRule::of(elementBytes, params.llThresholdBytes, llPayloadOf(params), params.simpleSliceBytes, -1)),
      llPayloadBytes(llPayloadOf(params)) {}

double Slicing::wireBytes(size_t elements, bool ll) const {
  return loom::wireBytes(static_cast<double>(elements * elementBytes), ll);
}

CollArgs CallSetup::argsFor(int rank) const {
  CollArgs args = base;
  args.rank = rank;
  args.hostOf = hostOf;
  return args;
}

bool setUpCall(const Topology& topo, const Call& call, const Params& params, CallSetup* setup, std::string* error) {
  int n = call.nranks;
  if (n < 1 || n > topo.rankCount()) {
    *error = "the topology has " + std::to_string(topo.rankCount()) + " ranks, not " + std::to_string(n);
    return false;
  }
  for (int r = 0; r < n; ++r) {
    if (topo.rankNode(r) < 0) {
      *error = "rank " + std::to_string(r) + " is not placed on any node of the topology";
      return false;
    }
  }
  std::vector<std::string> known = algorithmsFor(call.collective);
  if (!call.algorithm.empty() && std::find(known.begin(), known.end(), call.algorithm) == known.end()) {
    std::string list;
    for (const std::string& name : known) list += (list.empty() ? "" : ", ") + name;
    *error = "no algorithm \"" + call.algorithm + "\" for " + collectiveName(call.collective) + " (" + list + ")";
    return false;
  }
  CallSetup built;
  built.algorithm = call.algorithm;
  built.slicing = Slicing(params, call.elementBytes);
  CollArgs& args = built.base;
  args.collective = call.collective;
  args.nranks = n;
  args.rank = 0;
  args.root = call.root;
  args.count = call.count;
  args.nChannels = call.nChannels;
  // The torus the topology's chips form, when all of them take part (part of a torus is none).
  std::vector<int> torus = n == topo.rankCount() ? topo.torusDims() : std::vector<int>();
  if (torus.size() <= static_cast<size_t>(kMaxTorusDims)) {
    args.torusDimCount = static_cast<int>(torus.size());
    std::copy(torus.begin(), torus.end(), args.torusDims);
  }
  // Hosts numbered from 0 in the order their first rank appears.
  std::unordered_map<int, int> hostIndex;
  for (int r = 0; r < n; ++r)
    built.hostOf.push_back(hostIndex.emplace(topo.rankHost(r), static_cast<int>(hostIndex.size())).first->second);
  if (args.torusDimCount > 1) {
    built.symmetries.emplace_back(args.torusDims, args.torusDims + args.torusDimCount);
    built.symmetryNames.emplace_back("torus");
  }
  int hosts = static_cast<int>(hostIndex.size());
  bool uniformHosts = hosts > 1 && n % hosts == 0;
  for (int r = 0; r < n && uniformHosts; ++r) uniformHosts = built.hostOf[r] == r / (n / hosts);
  if (uniformHosts) {
    built.symmetries.push_back({hosts, n / hosts});
    built.symmetryNames.emplace_back("hosts");
  }
  built.symmetries.push_back({n});
  built.symmetryNames.emplace_back("shift");
  *setup = std::move(built);
  return true;
}

RankShape compressPlan(const RankPlan& plan, const Slicing& slicing) {
  RankShape shape;
  for (const Lane& lane : plan.lanes) {
    shape.steps += lane.steps.size();
    LaneShape out;
    out.channel = lane.channel;
    std::vector<uint64_t> totals;  // elements of each run, summed
    std::vector<uint64_t> firsts;  // elements of each run's first step
    for (size_t phase = 0; phase < lane.phaseCount(); ++phase) {
      PhaseShape shapeOfPhase;
      shapeOfPhase.firstRun = static_cast<uint32_t>(out.runs.size());
      size_t previous = SIZE_MAX;  // the last step with slices: a run holds steps next to each other only
      for (size_t s = lane.phaseBegin(phase); s < lane.phaseEnd(phase); ++s) {
        const Step& step = lane.steps[s];
        size_t count = step.count();
        if (count == 0) continue;  // no slices: the cursor skips it, and no message goes
        bool adjacent = previous != SIZE_MAX && s == previous + 1;
        previous = s;
        Run run;
        if (actionReceives(step.action)) {
          run.flags |= kReceives;
          run.recvPeer = step.recvPeer;
        }
        if (actionSends(step.action)) {
          run.flags |= kSends;
          run.sendPeer = step.sendPeer;
        }
        run.ll = slicing.isLL(count);
        run.slices = static_cast<uint32_t>(slicing.slicesOf(count));
        shapeOfPhase.rounds = std::max(shapeOfPhase.rounds, run.slices);
        if (adjacent && out.runs.size() > shapeOfPhase.firstRun) {
          Run& last = out.runs.back();
          uint64_t first = firsts.back();
          if (last.flags == run.flags && last.recvPeer == run.recvPeer && last.sendPeer == run.sendPeer &&
              last.ll == run.ll && last.slices == run.slices && (count > first ? count - first : first - count) <= 1) {
            ++last.steps;
            totals.back() += count;
            continue;
          }
        }
        run.steps = 1;
        out.runs.push_back(run);
        totals.push_back(count);
        firsts.push_back(count);
      }
      shapeOfPhase.runCount = static_cast<uint32_t>(out.runs.size()) - shapeOfPhase.firstRun;
      if (shapeOfPhase.runCount > 0) out.phases.push_back(shapeOfPhase);
    }
    for (size_t i = 0; i < out.runs.size(); ++i)
      out.runs[i].elements = (totals[i] + out.runs[i].steps / 2) / out.runs[i].steps;
    if (!out.runs.empty()) shape.lanes.push_back(std::move(out));
  }
  return shape;
}

bool buildShapes(const CallSetup& setup, const Params& params, ShapeSet* shapes, std::string* error) {
  int n = setup.base.nranks;
  *shapes = ShapeSet();
  std::vector<int> sample = sampleRanks(n);
  std::vector<RankShape> sampled;
  size_t sampledSteps = 0;
  for (int rank : sample) {
    sampled.push_back(shapeOf(setup, rank));
    sampledSteps += sampled.back().steps;
  }
  double estimate = static_cast<double>(sampledSteps) / sample.size() * n;
  bool tried = !params.buildAll && (estimate > static_cast<double>(params.symmetryMinSteps) ||
                                    estimate > static_cast<double>(params.maxSteps));
  bool extended = tried && extendBySymmetry(setup, params, sample, sampled, shapes);
  if (!extended) {
    if (estimate > static_cast<double>(params.maxSteps)) {
      *error = "its plans hold about " + std::to_string(static_cast<uint64_t>(estimate)) +
               " steps over all ranks, more than the limit of " + std::to_string(params.maxSteps);
      if (tried)
        *error +=
            ", and they differ from rank to rank beyond a shift of ranks, of torus or of host coordinates (as plans "
            "do whose steps move nothing on some ranks), so every one would have to be built";
      return false;
    }
    if (static_cast<int>(sample.size()) == n) {  // the sample is every rank, in order
      shapes->ranks = std::move(sampled);
    } else {
      shapes->ranks.assign(n, {});
      forEachRank(n, threadCount(params), [&](int rank) { shapes->ranks[rank] = shapeOf(setup, rank); });
    }
  }
  for (const RankShape& shape : shapes->ranks) shapes->steps += shape.steps;
  int channels = setup.base.nChannels;
  bool canFold = channels > 1;
  for (size_t r = 0; r < shapes->ranks.size() && canFold; ++r) canFold = foldable(shapes->ranks[r], channels);
  if (canFold) {
    for (RankShape& shape : shapes->ranks) fold(&shape, channels);
    shapes->folded = channels;
  }
  for (RankShape& shape : shapes->ranks) numberConnections(&shape);
  return true;
}

std::vector<RankPlan> buildPlans(const CallSetup& setup) {
  std::vector<RankPlan> plans(setup.base.nranks);
  for (int rank = 0; rank < setup.base.nranks; ++rank) buildPlan(setup.argsFor(rank), setup.algorithm, &plans[rank]);
  return plans;
}

}  // namespace loom::sim
