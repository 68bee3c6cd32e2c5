// Pipeline schedules and their simulation (schedule.h).
#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

namespace loom::parallel::pipeline {
namespace {

struct Work {
  Op op;
  int microBatch, chunk;
};

// Adds `work` to a stage's list with the communication around it: a forward receives its input from the virtual
// stage before (unless it is the first) and sends its output on (unless it is the last); a backward receives the
// output's gradient and sends the input's.
void append(const Plan& plan, int stage, const Work& work, std::vector<Action>* actions) {
  const int virtualStage = work.chunk * plan.stages + stage, last = plan.stages * plan.chunks - 1;
  const Action compute{work.op, work.microBatch, work.chunk};
  if (work.op == Op::kForward) {
    if (virtualStage > 0) actions->push_back({Op::kReceiveActivation, work.microBatch, work.chunk});
    actions->push_back(compute);
    if (virtualStage < last) actions->push_back({Op::kSendActivation, work.microBatch, work.chunk});
  } else if (work.op == Op::kBackward) {
    if (virtualStage < last) actions->push_back({Op::kReceiveGradient, work.microBatch, work.chunk});
    actions->push_back(compute);
    if (virtualStage > 0) actions->push_back({Op::kSendGradient, work.microBatch, work.chunk});
  } else {
    actions->push_back(compute);
  }
}

// The k-th forward or backward of a stage in Megatron's interleaved order: micro-batches in groups of p through
// each chunk in turn (backwards through the chunks from the last).
Work interleavedWork(Op op, int k, int p, int v) {
  const int group = k / (p * v), chunk = (k / p) % v;
  return {op, group * p + k % p, op == Op::kForward ? chunk : v - 1 - chunk};
}

// ZB-H1's W's: with 1F1B's forwards and backwards in their order, each stage runs a pending W whenever its next
// forward or backward would wait for its input, and the rest at the end, as a greedy run with F, B and W of equal
// cost decides; forwards wait while a stage holds p micro-batches not yet through W (1F1B's peak on stage 0, so
// the memory of 1F1B). Rewrites the plan's lists with the W's in place.
void placeWeights(Plan* plan) {
  const int p = plan->stages, m = plan->microBatches;
  std::vector<std::vector<Action>> work(p);  // each stage's F and B, in order
  for (int s = 0; s < p; ++s)
    for (const Action& action : plan->perStage[s])
      if (action.op == Op::kForward || action.op == Op::kBackward) work[s].push_back(action);
  // When each micro-batch's activation reaches a stage (input of F) and its gradient (input of B).
  std::vector<std::vector<double>> activationAt(p, std::vector<double>(m, -1)),
      gradientAt(p, std::vector<double>(m, -1));
  for (int i = 0; i < m; ++i) activationAt[0][i] = 0;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> forwards(p, 0), weights(p, 0), backwards(p, 0);
  std::vector<std::vector<Work>> order(p);
  for (;;) {
    // The stage that can start something soonest, and what.
    int best = -1;
    double bestStart = 0;
    bool bestWeight = false;
    for (int s = 0; s < p; ++s) {
      double start = -1;
      bool weight = false;
      if (next[s] < work[s].size()) {
        const Action& action = work[s][next[s]];
        const bool forward = action.op == Op::kForward;
        const double ready = forward ? activationAt[s][action.microBatch]
                                     : (s == p - 1 ? (forwards[s] > action.microBatch ? clock[s] : -1)
                                                   : gradientAt[s][action.microBatch]);
        const bool roomy = !forward || forwards[s] - weights[s] < p;
        if (ready >= 0 && roomy) start = std::max(clock[s], ready);
      }
      const bool pendingWeight = weights[s] < backwards[s];
      if (pendingWeight && (start < 0 || start > clock[s])) {
        start = clock[s];
        weight = true;
      }
      if (start >= 0 && (best < 0 || start < bestStart)) {
        best = s;
        bestStart = start;
        bestWeight = weight;
      }
    }
    if (best < 0) break;
    const int s = best;
    if (bestWeight) {
      order[s].push_back({Op::kWeight, weights[s]++, 0});
    } else {
      const Action action = work[s][next[s]++];
      order[s].push_back({action.op, action.microBatch, 0});
      if (action.op == Op::kForward) {
        ++forwards[s];
        if (s + 1 < p) activationAt[s + 1][action.microBatch] = bestStart + 1;
      } else {
        ++backwards[s];
        if (s > 0) gradientAt[s - 1][action.microBatch] = bestStart + 1;
      }
    }
    clock[s] = bestStart + 1;
  }
  for (int s = 0; s < p; ++s)
    if (next[s] != work[s].size() || weights[s] != m) {  // a 1F1B order always completes; this cannot stall
      std::fprintf(stderr, "pipeline: ZB-H1's placement stalled at stage %d (%zu of %zu actions, %d of %d W's)\n", s,
                   next[s], work[s].size(), weights[s], m);
      std::abort();
    }
  for (int s = 0; s < p; ++s) {
    plan->perStage[s].clear();
    for (const Work& w : order[s]) append(*plan, s, w, &plan->perStage[s]);
  }
}

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kWeight:
      return "W";
    case Op::kSendActivation:
      return "send-activation";
    case Op::kReceiveActivation:
      return "recv-activation";
    case Op::kSendGradient:
      return "send-gradient";
    case Op::kReceiveGradient:
      return "recv-gradient";
  }
  return "?";
}

bool makePlan(Schedule schedule, int p, int m, int v, Plan* out, std::string* error) {
  if (p < 1 || m < 1 || v < 1) {
    *error = "stages, micro-batches and chunks must be at least 1";
    return false;
  }
  if (schedule != Schedule::kInterleaved && v != 1) {
    *error = std::string(plan::scheduleName(schedule)) + " runs one chunk per stage, not " + std::to_string(v);
    return false;
  }
  if (schedule == Schedule::kInterleaved && m % p != 0) {
    *error = "interleaved 1F1B takes micro-batches in groups of the stages: " + std::to_string(m) +
             " is not a multiple of " + std::to_string(p);
    return false;
  }
  Plan plan;
  plan.schedule = schedule;
  plan.stages = p;
  plan.microBatches = m;
  plan.chunks = v;
  plan.splitBackward = schedule == Schedule::kZbH1;
  plan.perStage.resize(p);
  for (int s = 0; s < p; ++s) {
    std::vector<Work> order;
    if (schedule == Schedule::kGpipe) {
      for (int i = 0; i < m; ++i) order.push_back({Op::kForward, i, 0});
      for (int i = 0; i < m; ++i) order.push_back({Op::kBackward, i, 0});
    } else if (schedule == Schedule::kInterleaved) {
      const int total = m * v, warmup = std::min(total, (p - s - 1) * 2 + (v - 1) * p);
      for (int k = 0; k < warmup; ++k) order.push_back(interleavedWork(Op::kForward, k, p, v));
      for (int k = 0; k < total - warmup; ++k) {
        order.push_back(interleavedWork(Op::kForward, warmup + k, p, v));
        order.push_back(interleavedWork(Op::kBackward, k, p, v));
      }
      for (int k = total - warmup; k < total; ++k) order.push_back(interleavedWork(Op::kBackward, k, p, v));
    } else {  // 1F1B (ZB-H1 is built from it below)
      const int warmup = std::min(p - s - 1, m);
      for (int i = 0; i < warmup; ++i) order.push_back({Op::kForward, i, 0});
      for (int i = 0; i < m - warmup; ++i) {
        order.push_back({Op::kForward, warmup + i, 0});
        order.push_back({Op::kBackward, i, 0});
      }
      for (int i = m - warmup; i < m; ++i) order.push_back({Op::kBackward, i, 0});
    }
    for (const Work& work : order) append(plan, s, work, &plan.perStage[s]);
  }
  if (schedule == Schedule::kZbH1) placeWeights(&plan);
  *out = std::move(plan);
  return true;
}

double Timeline::bubble() const {
  if (busy <= 0) return 0;
  int stages = 0;
  for (const Span& span : spans) stages = std::max(stages, span.stage + 1);
  return (makespan * stages - busy) / busy;
}

Costs Timeline::meanCosts() const {
  double sums[3] = {0, 0, 0};
  int counts[3] = {0, 0, 0};
  for (const Span& span : spans) {
    const int kind = span.action.op == Op::kForward ? 0 : span.action.op == Op::kBackward ? 1 : 2;
    sums[kind] += span.end - span.start;
    ++counts[kind];
  }
  Costs costs;
  costs.forward = counts[0] > 0 ? sums[0] / counts[0] : 0;
  costs.backward = counts[1] > 0 ? sums[1] / counts[1] : 0;
  costs.weight = counts[2] > 0 ? sums[2] / counts[2] : 0;
  return costs;
}

std::string Timeline::render(int columnsPerUnit, double unit) const {
  int stages = 0;
  for (const Span& span : spans) stages = std::max(stages, span.stage + 1);
  const double scale = columnsPerUnit / unit;
  const int width = static_cast<int>(std::ceil(makespan * scale - 1e-9));
  std::vector<std::string> rows(stages, std::string(width, '.'));
  for (const Span& span : spans) {
    const int from = static_cast<int>(std::lround(span.start * scale));
    const int to = static_cast<int>(std::lround(span.end * scale));
    const std::string label = std::string(opName(span.action.op)) + std::to_string(span.action.microBatch);
    for (int c = from; c < to && c < width; ++c)
      rows[span.stage][c] = label[std::min<size_t>(c - from, label.size() - 1)];
  }
  std::string text;
  for (int s = 0; s < stages; ++s) text += "stage " + std::to_string(s) + " |" + rows[s] + "|\n";
  return text;
}

bool simulate(const Plan& plan, const Costs& costs, Timeline* out, std::string* error) {
  const int p = plan.stages;
  // A message is (kind: 0 activation, 1 gradient; micro-batch; the virtual stage that sends it).
  using Message = std::tuple<int, int, int>;
  std::map<Message, double> sent;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  Timeline timeline;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<Action>& actions = plan.perStage[s];
      while (next[s] < actions.size()) {
        const Action& action = actions[next[s]];
        const int virtualStage = action.chunk * p + s;
        if (action.op == Op::kSendActivation || action.op == Op::kSendGradient) {
          sent[{action.op == Op::kSendGradient, action.microBatch, virtualStage}] = clock[s];
        } else if (action.op == Op::kReceiveActivation || action.op == Op::kReceiveGradient) {
          const bool gradient = action.op == Op::kReceiveGradient;
          const auto found = sent.find({gradient, action.microBatch, gradient ? virtualStage + 1 : virtualStage - 1});
          if (found == sent.end()) break;  // its sender has not got there yet
          clock[s] = std::max(clock[s], found->second);
        } else {
          double cost = action.op == Op::kForward  ? costs.forward
                        : action.op == Op::kWeight ? costs.weight
                                                   : costs.backward;
          if (action.op == Op::kBackward && !plan.splitBackward) cost += costs.weight;
          timeline.spans.push_back({s, action, clock[s], clock[s] + cost});
          clock[s] += cost;
          timeline.busy += cost;
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    if (next[s] < plan.perStage[s].size()) {
      const Action& stuck = plan.perStage[s][next[s]];
      *error = "stage " + std::to_string(s) + " waits forever at " + opName(stuck.op) + " of micro-batch " +
               std::to_string(stuck.microBatch) + " (chunk " + std::to_string(stuck.chunk) + ")";
      return false;
    }
  for (double end : clock) timeline.makespan = std::max(timeline.makespan, end);
  std::sort(timeline.spans.begin(), timeline.spans.end(),
            [](const Span& a, const Span& b) { return a.start != b.start ? a.start < b.start : a.stage < b.stage; });
  *out = std::move(timeline);
  return true;
}

}  // namespace loom::parallel::pipeline
