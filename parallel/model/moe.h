// The mixture-of-experts MLP of the reference GPT (GptConfig::experts > 0): in place of a block's MLP, E expert MLPs
// (each GPT-2's MLP with a hidden width of ffn) and a linear router without bias, [E, C].
//
// Routing (on the host, from the router's logits): a softmax over the E experts; each token's top-k experts (ties
// to the lower index), its gates their probabilities (not renormalised: Switch's and Megatron's default). With a
// capacity factor f > 0 each expert takes at most ceil(f N k / E) of a micro-batch's N tokens on this rank and drops
// the rest (the token-drop policy: by position, the earlier tokens first, or by probability, the more confident
// assignments first); a dropped assignment adds nothing, and the token keeps its residual. The load-balancing loss
// (Switch's, as Megatron computes it) is a E sum_e f_e P_e, with f_e the fraction of the N k assignments routed to
// expert e before any drop and P_e the mean router probability of e; its gradient reaches the router through P.
//
// Expert parallelism: with an expert-parallel communicator of ep ranks, rank r holds experts r E/ep to (r+1) E/ep - 1
// and every rank routes its own tokens. Dispatch: the rows each token sends (one per kept assignment) are gathered
// in the order of their experts, the per-expert counts exchanged with loomAllToAll, the rows with loomAllToAllv, and
// regrouped by local expert; each expert runs its MLP over its rows as one batch; combine returns the outputs the
// same way and sums each token's k outputs weighted by its gates. Backward runs the same exchanges for the outputs'
// gradients and back. Without expert parallelism the same path runs without the exchanges.
//
// The forward dispatch may instead go through loom's expert dispatch (loom_ep.h, MoeShape::dispatch): one
// loomEpDispatch sends each token once per rank with its kept experts and gates, and its rows arrive grouped by
// local expert in the same order as above (source rank, then token), so the experts see the same batches. The
// rest (the combine, whose per-assignment outputs the gates' gradients need, and the backward exchanges) stays on
// loomAllToAllv, whose counts route() exchanges either way. Host memory only (the CPU kernels).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "loom/loom_ep.h"
#include "parallel/kernels/ops.h"
#include "parallel/scalars.h"
#include "parallel/tensor.h"

namespace loom::parallel {

enum class DropPolicy { kPosition, kProbability };
const char* dropPolicyName(DropPolicy policy);

// How the forward dispatch moves the rows: loomAllToAllv, or loom's expert dispatch in either mode.
enum class ExpertDispatch { kAllToAllv, kEpNormal, kEpLowLatency };
const char* expertDispatchName(ExpertDispatch dispatch);
// "alltoallv", "ep-normal", "ep-low-latency"; false for any other name.
bool parseExpertDispatch(const std::string& name, ExpertDispatch* out);

// What the MoE layer needs of the model's configuration.
struct MoeShape {
  int experts = 0, topk = 1, channels = 0, hidden = 0;  // hidden: each expert's MLP width
  float capacityFactor = 0;                             // 0: no capacity, nothing dropped
  DropPolicy dropPolicy = DropPolicy::kPosition;
  float auxLossCoefficient = 0;
  ExpertDispatch dispatch = ExpertDispatch::kAllToAllv;
};

// One micro-batch's routing and activations in one MoE layer.
struct MoeState {
  int tokens = 0;
  // Routing, on the host: probabilities [N, E]; per assignment (token t's j-th choice at t k + j) its expert, gate
  // and row among the rows sent (-1 where dropped); per row sent, its token and gate.
  std::vector<float> probs, gates, sendGates;
  std::vector<int32_t> choice, slotOf, sendTokens;
  std::vector<double> routedFraction;  // f_e
  // Rows to and from each expert-parallel peer, per local expert from each peer ([peer][expert]), and the rows
  // received grouped by local expert: expert-major row r is source-major row toExpertMajor[r]; toSourceMajor is the
  // inverse; expertRows[e] the first row of local expert e (e = local experts: the end).
  std::vector<size_t> sendRows, receiveRows;
  std::vector<int32_t> receivedPerExpert, toExpertMajor, toSourceMajor, expertRows;
  float auxLoss = 0;
  int dropped = 0;  // assignments over capacity
  // In the Ops' memory: the index arrays, and the rows. dlogits: the router's input of W.
  Tensor slotOfDevice, sendTokensDevice, sendGatesDevice, toExpertMajorDevice, toSourceMajorDevice;
  Tensor dispatched, received, fc, fcGelu, expertOut, returned;
  Tensor dExpertOut, dFc, dlogits;
  size_t bytes() const;
};

// The parameters of one MoE layer: the router [E, C] and this rank's experts, one after another, each c_fc
// weight [F, C], c_fc bias [F], c_proj weight [C, F], c_proj bias [C].
struct MoeParams {
  const void* router;
  const void* experts;
};
struct MoeGrads {
  void* router;
  void* experts;
};

class MoeLayer {
 public:
  // `expertParallel` null: one rank holds every expert.
  MoeLayer(const MoeShape& shape, Ops& ops, loomComm_t expertParallel);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;
  int localExperts() const { return shape_.experts / ep_; }
  size_t expertElements() const;  // one expert's parameters

  // x [N, C] in, out [N, C] written: routes, dispatches, runs the experts, combines. Returns the load-balancing loss
  // (times its coefficient).
  float forward(MoeState& state, void* out, const void* x, int N, const MoeParams& params);
  // From dout [N, C] (the layer output's gradient, the loss's scale in it) adds to dx [N, C] with `input`, and to
  // the parameters' gradients with `weights` (ZB-H1's B and W; W alone needs no communication). lossScale scales the
  // load-balancing loss's gradient.
  void backward(MoeState& state, void* dx, const void* dout, const void* x, const MoeParams& params,
                const MoeGrads& grads, float lossScale, bool input, bool weights);
  // A host value summed over the expert-parallel ranks (itself without expert parallelism).
  double sumOverRanks(double value) { return scalars_ ? scalars_->sum(value) : value; }

 private:
  void route(MoeState& state, int N);
  // Rows of C values to and from the expert-parallel peers: rows[p] to peer p from `send`, in peer order, and
  // received[p] from peer p into `receive`, in peer order. Copies without expert parallelism.
  void exchange(const void* send, const std::vector<size_t>& sendRows, void* receive,
                const std::vector<size_t>& receiveRows);
  // The forward dispatch through loom's expert dispatch: x's kept rows into s.received, expert-major.
  void epDispatch(MoeState& state, const void* x, int N);
  Tensor rows(size_t count, int width) const;
  Tensor indices(const std::vector<int32_t>& values) const;
  Tensor floats(const std::vector<float>& values) const;

  MoeShape shape_;
  Ops& ops_;
  loomComm_t comm_;
  int ep_ = 1, epRank_ = 0;
  loomStream_t stream_ = nullptr;
  std::unique_ptr<Scalars> scalars_;
  Tensor counts_;  // the per-expert counts' exchange, int32 [2 ep E/ep]
  loomEp_t epObject_ = nullptr;  // MoeShape::dispatch's EP object, made for up to epTokens_ tokens per rank
  int epTokens_ = 0;
  std::vector<unsigned char> epRecv_;
};

}  // namespace loom::parallel
