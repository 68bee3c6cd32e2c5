// Plan IR helpers: names, buffer sizes per collective, even splits, step constructors and a plan dump.
#include "algorithms/plan.h"

#include <cctype>
#include <cstdio>
#include <string>

namespace loom {

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "AllReduce";
    case Collective::kBroadcast:
      return "Broadcast";
    case Collective::kReduce:
      return "Reduce";
    case Collective::kAllGather:
      return "AllGather";
    case Collective::kReduceScatter:
      return "ReduceScatter";
    case Collective::kAllToAll:
      return "AllToAll";
    case Collective::kAllToAllv:
      return "AllToAllv";
    case Collective::kGather:
      return "Gather";
    case Collective::kScatter:
      return "Scatter";
    case Collective::kSendRecv:
      return "SendRecv";
    case Collective::kBarrier:
      return "Barrier";
  }
  return "?";
}

namespace {

// A name folded for comparison: lower case, without "_" and "-".
std::string foldName(std::string_view name) {
  std::string folded;
  for (char c : name)
    if (c != '_' && c != '-') folded += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return folded;
}

}  // namespace

bool parseCollectiveName(std::string_view name, Collective* collective) {
  const std::string folded = foldName(name);
  for (int c = 0; c <= static_cast<int>(Collective::kBarrier); ++c) {
    if (foldName(collectiveName(static_cast<Collective>(c))) != folded) continue;
    *collective = static_cast<Collective>(c);
    return true;
  }
  return false;
}

std::string collectiveHelpName(Collective collective) {
  const std::string name = foldName(collectiveName(collective));
  // nccl-tests' program names (all_reduce_perf, ...) where they put "_" between words.
  const char* ncclTests = collective == Collective::kAllReduce       ? "all_reduce"
                          : collective == Collective::kAllGather     ? "all_gather"
                          : collective == Collective::kReduceScatter ? "reduce_scatter"
                                                                     : nullptr;
  return ncclTests != nullptr ? name + " (" + ncclTests + ")" : name;
}

const char* actionName(Action action) {
  switch (action) {
    case Action::kSend:
      return "send";
    case Action::kRecv:
      return "recv";
    case Action::kRecvReduce:
      return "recvReduce";
    case Action::kRecvReduceSend:
      return "recvReduceSend";
    case Action::kRecvReduceCopySend:
      return "recvReduceCopySend";
    case Action::kRecvCopySend:
      return "recvCopySend";
    case Action::kCopy:
      return "copy";
    case Action::kReduce:
      return "reduce";
  }
  return "?";
}

size_t inputCountOf(const CollArgs& args) {
  size_t n = static_cast<size_t>(args.nranks);
  switch (args.collective) {
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return args.count * n;
    case Collective::kScatter:
      return args.rank == args.root ? args.count * n : 0;
    case Collective::kBroadcast:
      return args.rank == args.root ? args.count : 0;
    case Collective::kAllToAllv: {
      size_t end = 0;
      for (size_t p = 0; p < args.sendCounts.size(); ++p) end = std::max(end, args.sendDispls[p] + args.sendCounts[p]);
      return end;
    }
    case Collective::kSendRecv:
    case Collective::kBarrier:
      return 0;
    default:
      return args.count;
  }
}

size_t outputCountOf(const CollArgs& args) {
  size_t n = static_cast<size_t>(args.nranks);
  switch (args.collective) {
    case Collective::kAllGather:
    case Collective::kAllToAll:
      return args.count * n;
    case Collective::kGather:
      return args.rank == args.root ? args.count * n : 0;
    case Collective::kReduce:
      return args.rank == args.root ? args.count : 0;
    case Collective::kAllToAllv: {
      size_t end = 0;
      for (size_t p = 0; p < args.recvCounts.size(); ++p) end = std::max(end, args.recvDispls[p] + args.recvCounts[p]);
      return end;
    }
    case Collective::kSendRecv:
    case Collective::kBarrier:
      return 0;
    default:
      return args.count;
  }
}

size_t partOffset(size_t count, int parts, int index) {
  size_t base = count / parts, extra = count % parts, i = static_cast<size_t>(index);
  return i * base + std::min(i, extra);
}

size_t partCount(size_t count, int parts, int index) {
  return count / parts + (static_cast<size_t>(index) < count % parts ? 1 : 0);
}

Step send(int peer, Region src) { return {Action::kSend, -1, peer, src, {}, {}}; }
Step recv(int peer, Region dst) { return {Action::kRecv, peer, -1, {}, {}, dst}; }
Step recvReduce(int peer, Region local, Region dst) { return {Action::kRecvReduce, peer, -1, local, {}, dst}; }
Step recvReduceSend(int peerIn, Region local, int peerOut) {
  return {Action::kRecvReduceSend, peerIn, peerOut, local, {}, {}};
}
Step recvReduceCopySend(int peerIn, Region local, Region dst, int peerOut) {
  return {Action::kRecvReduceCopySend, peerIn, peerOut, local, {}, dst};
}
Step recvCopySend(int peerIn, Region dst, int peerOut) { return {Action::kRecvCopySend, peerIn, peerOut, {}, {}, dst}; }
Step copy(Region src, Region dst) { return {Action::kCopy, -1, -1, src, {}, dst}; }
Step reduce(Region src, Region src2, Region dst) { return {Action::kReduce, -1, -1, src, src2, dst}; }

std::string describeRegion(const Region& region) {
  static const char* kNames[] = {"in", "out", "scratch"};
  char text[96];
  std::snprintf(text, sizeof(text), "%s%s[%zu+%zu]", kNames[static_cast<int>(region.buffer)],
                region.bufferIndex ? ("#" + std::to_string(region.bufferIndex)).c_str() : "", region.offset,
                region.count);
  return text;
}

std::string describeStep(const Step& step) {
  std::string text = actionName(step.action);
  if (actionReceives(step.action)) text += " from " + std::to_string(step.recvPeer);
  if (actionSends(step.action)) text += " to " + std::to_string(step.sendPeer);
  if (step.action != Action::kRecv && step.action != Action::kRecvCopySend) text += " src " + describeRegion(step.src);
  if (step.action == Action::kReduce) text += " src2 " + describeRegion(step.src2);
  if (step.action != Action::kSend && step.action != Action::kRecvReduceSend)
    text += " dst " + describeRegion(step.dst);
  return text;
}

std::string describe(const RankPlan& plan) {
  std::string text = std::string("algorithm ") + plan.algorithm + "\n";
  for (size_t l = 0; l < plan.lanes.size(); ++l) {
    text += "  lane " + std::to_string(l) + " (channel " + std::to_string(plan.lanes[l].channel) + ")\n";
    const Lane& lane = plan.lanes[l];
    for (size_t s = 0; s < lane.steps.size(); ++s) {
      const Step& step = lane.steps[s];
      for (size_t p = 1; p < lane.phaseCount(); ++p)
        if (lane.phaseBegin(p) == s) text += "    -- phase " + std::to_string(p) + "\n";
      text += "    " + describeStep(step) + "\n";
    }
  }
  return text;
}

}  // namespace loom
