// The mixture-of-experts MLP (moe.h).
#include "parallel/model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "parallel/check.h"

namespace loom::parallel {

const char* dropPolicyName(DropPolicy policy) { return policy == DropPolicy::kPosition ? "position" : "probability"; }

const char* expertDispatchName(ExpertDispatch dispatch) {
  return dispatch == ExpertDispatch::kAllToAllv  ? "alltoallv"
         : dispatch == ExpertDispatch::kEpNormal ? "ep-normal"
                                                 : "ep-low-latency";
}

bool parseExpertDispatch(const std::string& name, ExpertDispatch* out) {
  for (ExpertDispatch d : {ExpertDispatch::kAllToAllv, ExpertDispatch::kEpNormal, ExpertDispatch::kEpLowLatency})
    if (name == expertDispatchName(d)) {
      *out = d;
      return true;
    }
  return false;
}

size_t MoeState::bytes() const {
  size_t total = 0;
  for (const Tensor* t :
       {&slotOfDevice, &sendTokensDevice, &sendGatesDevice, &toExpertMajorDevice, &toSourceMajorDevice, &dispatched,
        &received, &fc, &fcGelu, &expertOut, &returned, &dExpertOut, &dFc, &dlogits})
    total += t->bytes();
  return total;
}

MoeLayer::MoeLayer(const MoeShape& shape, Ops& ops, loomComm_t expertParallel)
    : shape_(shape), ops_(ops), comm_(expertParallel) {
  if (comm_ != nullptr) {
    loomCommCount(comm_, &ep_);
    loomCommUserRank(comm_, &epRank_);
  }
  if (shape.experts < 1 || shape.topk < 1 || shape.topk > shape.experts || shape.experts % ep_ != 0) {
    std::fprintf(stderr,
                 "moe: %d experts, top-%d, over %d expert-parallel ranks: top-k must be from 1 to the experts "
                 "and the ranks must divide the experts\n",
                 shape.experts, shape.topk, ep_);
    std::abort();
  }
  if (shape.dispatch != ExpertDispatch::kAllToAllv && ops_.onDevice()) {
    std::fprintf(stderr, "moe: the %s dispatch takes host memory; the CUDA kernels use alltoallv\n",
                 expertDispatchName(shape.dispatch));
    std::abort();
  }
  if (ep_ > 1) {
    stream_ = ops_.createStream();
    scalars_ = std::make_unique<Scalars>(comm_, ops_);
    counts_ = Tensor::zeros({2 * static_cast<int64_t>(shape.experts)}, DType::kInt32, &ops_);
  }
}

MoeLayer::~MoeLayer() {
  if (epObject_ != nullptr) loomEpDestroy(epObject_);
  if (stream_ != nullptr) ops_.destroyStream(stream_);
}

void MoeLayer::epDispatch(MoeState& s, const void* x, int N) {
  const int k = shape_.topk, C = shape_.channels, local = localExperts();
  // The EP object is collective: every expert-parallel rank makes it at the same call, for the largest N of any
  // rank so far (the ranks' micro-batches have the same shape).
  int tokens = std::max(N, 1);
  LOOM_PAR_CHECK(comm_, loomAllReduce(&tokens, &tokens, 1, loomInt32, loomMax, comm_, nullptr));
  if (epObject_ == nullptr || tokens > epTokens_) {
    if (epObject_ != nullptr) loomEpDestroy(epObject_);
    loomEpConfig_t config = LOOM_EP_CONFIG_INITIALIZER;
    config.maxTokensPerRank = tokens;
    config.hidden = C;
    config.numExperts = shape_.experts;
    config.topk = k;
    config.datatype = loomTypeOf(ops_.dtype());
    config.mode = shape_.dispatch == ExpertDispatch::kEpLowLatency ? loomEpLowLatency : loomEpNormal;
    LOOM_PAR_CHECK(comm_, loomEpCreate(comm_, &config, &epObject_));
    epTokens_ = tokens;
    epRecv_.assign(static_cast<size_t>(local) * ep_ * tokens * C * ops_.elementBytes(), 0);
  }
  // Each token's kept experts (a dropped assignment is no expert) and their gates.
  std::vector<int32_t> idx(static_cast<size_t>(N) * k);
  for (size_t a = 0; a < idx.size(); ++a) idx[a] = s.slotOf[a] >= 0 ? s.choice[a] : -1;
  std::vector<int> counts(local);
  loomEpHandle_t handle = nullptr;
  LOOM_PAR_CHECK(comm_, loomEpDispatch(epObject_, x, N, idx.data(), s.gates.data(), epRecv_.data(), counts.data(),
                                       &handle, nullptr));
  loomEpHandleFree(handle);
  // Expert e's rows lie at e * capacity; the layer keeps them one expert after another.
  const size_t rowBytes = static_cast<size_t>(C) * ops_.elementBytes(), capacity = static_cast<size_t>(ep_) * epTokens_;
  for (int e = 0; e < local; ++e) {
    if (counts[e] != s.expertRows[e + 1] - s.expertRows[e]) {
      std::fprintf(stderr, "moe: expert dispatch gave local expert %d %d rows where the counts say %d\n", e, counts[e],
                   s.expertRows[e + 1] - s.expertRows[e]);
      std::abort();
    }
    std::memcpy(elementAt(ops_, s.received.data(), static_cast<size_t>(s.expertRows[e]) * C),
                epRecv_.data() + e * capacity * rowBytes, counts[e] * rowBytes);
  }
}

size_t MoeLayer::expertElements() const {
  const size_t C = shape_.channels, F = shape_.hidden;
  return F * C + F + C * F + C;
}

Tensor MoeLayer::rows(size_t count, int width) const {
  return Tensor::zeros({static_cast<int64_t>(count), width}, ops_.dtype(), &ops_);
}

Tensor MoeLayer::indices(const std::vector<int32_t>& values) const {
  Tensor tensor = Tensor::zeros({static_cast<int64_t>(values.size())}, DType::kInt32, &ops_);
  if (!values.empty()) ops_.upload(tensor.data(), values.data(), values.size() * sizeof(int32_t));
  return tensor;
}

Tensor MoeLayer::floats(const std::vector<float>& values) const {
  Tensor tensor = Tensor::zeros({static_cast<int64_t>(values.size())}, DType::kFloat32, &ops_);
  if (!values.empty()) ops_.upload(tensor.data(), values.data(), values.size() * sizeof(float));
  return tensor;
}

void MoeLayer::exchange(const void* send, const std::vector<size_t>& sendRows, void* receive,
                        const std::vector<size_t>& receiveRows) {
  const size_t C = shape_.channels;
  if (ep_ == 1) {
    if (sendRows[0] > 0) ops_.copy(receive, send, sendRows[0] * C * ops_.elementBytes());
    return;
  }
  std::vector<size_t> sendCounts(ep_), sendDispls(ep_), receiveCounts(ep_), receiveDispls(ep_);
  size_t sent = 0, received = 0;
  for (int p = 0; p < ep_; ++p) {
    sendCounts[p] = sendRows[p] * C;
    sendDispls[p] = sent;
    sent += sendCounts[p];
    receiveCounts[p] = receiveRows[p] * C;
    receiveDispls[p] = received;
    received += receiveCounts[p];
  }
  ops_.commAfterCompute(stream_);
  LOOM_PAR_CHECK(comm_, loomAllToAllv(send, sendCounts.data(), sendDispls.data(), receive, receiveCounts.data(),
                                      receiveDispls.data(), loomTypeOf(ops_.dtype()), comm_, stream_));
  LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
}

void MoeLayer::route(MoeState& s, int N) {
  const int E = shape_.experts, k = shape_.topk, local = localExperts();
  // Softmax over the experts, in double.
  for (int t = 0; t < N; ++t) {
    float* p = s.probs.data() + static_cast<size_t>(t) * E;
    const float top = *std::max_element(p, p + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(p[e]) - top);
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(p[e]) - top) / sum);
  }
  // Each token's top k, ties to the lower expert.
  s.choice.assign(static_cast<size_t>(N) * k, -1);
  s.gates.assign(static_cast<size_t>(N) * k, 0.0f);
  std::vector<int> order(E);
  std::vector<double> routed(E, 0.0);
  for (int t = 0; t < N; ++t) {
    const float* p = s.probs.data() + static_cast<size_t>(t) * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
    for (int j = 0; j < k; ++j) {
      s.choice[static_cast<size_t>(t) * k + j] = order[j];
      s.gates[static_cast<size_t>(t) * k + j] = p[order[j]];
      routed[order[j]] += 1;
    }
  }
  // The load-balancing loss: coefficient E sum_e f_e P_e.
  s.routedFraction.assign(E, 0.0);
  double aux = 0;
  for (int e = 0; e < E; ++e) {
    s.routedFraction[e] = routed[e] / (static_cast<double>(N) * k);
    double meanProbability = 0;
    for (int t = 0; t < N; ++t) meanProbability += s.probs[static_cast<size_t>(t) * E + e];
    aux += s.routedFraction[e] * meanProbability / N;
  }
  s.auxLoss = static_cast<float>(shape_.auxLossCoefficient * E * aux);
  // Capacity: which assignments each expert keeps.
  const size_t capacity = shape_.capacityFactor > 0
                              ? static_cast<size_t>(std::ceil(shape_.capacityFactor * N * k / static_cast<double>(E)))
                              : static_cast<size_t>(N) * k;
  std::vector<std::vector<int>> assigned(E);  // assignment indices (t k + j), in token order
  for (int a = 0; a < N * k; ++a) assigned[s.choice[a]].push_back(a);
  s.slotOf.assign(static_cast<size_t>(N) * k, -1);
  s.dropped = 0;
  std::vector<std::vector<int>> kept(E);
  for (int e = 0; e < E; ++e) {
    std::vector<int>& mine = assigned[e];
    if (mine.size() > capacity) {
      if (shape_.dropPolicy == DropPolicy::kProbability)
        std::stable_sort(mine.begin(), mine.end(), [&](int a, int b) { return s.gates[a] > s.gates[b]; });
      s.dropped += static_cast<int>(mine.size() - capacity);
      mine.resize(capacity);
      std::sort(mine.begin(), mine.end());  // back to token order
    }
    kept[e] = mine;
  }
  // Rows sent: by expert (so by peer, then local expert), then token.
  s.sendTokens.clear();
  s.sendGates.clear();
  s.sendRows.assign(ep_, 0);
  std::vector<int32_t> counts(E, 0);
  for (int e = 0; e < E; ++e) {
    for (int a : kept[e]) {
      s.slotOf[a] = static_cast<int32_t>(s.sendTokens.size());
      s.sendTokens.push_back(a / k);
      s.sendGates.push_back(s.gates[a]);
    }
    counts[e] = static_cast<int32_t>(kept[e].size());
    s.sendRows[e / local] += kept[e].size();
  }
  // The counts per local expert from every peer: [peer][local expert].
  if (ep_ == 1) {
    s.receivedPerExpert = counts;
  } else {
    ops_.upload(counts_.data(), counts.data(), E * sizeof(int32_t));
    int32_t* incoming = counts_.i32() + E;
    ops_.commAfterCompute(stream_);
    LOOM_PAR_CHECK(comm_, loomAllToAll(counts_.data(), incoming, local, loomInt32, comm_, stream_));
    LOOM_PAR_CHECK(comm_, ops_.synchronize(stream_, comm_));
    s.receivedPerExpert.assign(E, 0);
    ops_.download(s.receivedPerExpert.data(), incoming, E * sizeof(int32_t));
  }
  s.receiveRows.assign(ep_, 0);
  std::vector<int32_t> peerStart(ep_ + 1, 0);
  for (int p = 0; p < ep_; ++p) {
    for (int e = 0; e < local; ++e) s.receiveRows[p] += s.receivedPerExpert[p * local + e];
    peerStart[p + 1] = peerStart[p] + static_cast<int32_t>(s.receiveRows[p]);
  }
  // Expert-major order: local expert e's rows from peer 0, then peer 1, ...
  s.toExpertMajor.clear();
  s.expertRows.assign(local + 1, 0);
  for (int e = 0; e < local; ++e) {
    s.expertRows[e] = static_cast<int32_t>(s.toExpertMajor.size());
    for (int p = 0; p < ep_; ++p) {
      int32_t from = peerStart[p];
      for (int before = 0; before < e; ++before) from += s.receivedPerExpert[p * local + before];
      for (int32_t i = 0; i < s.receivedPerExpert[p * local + e]; ++i) s.toExpertMajor.push_back(from + i);
    }
  }
  s.expertRows[local] = static_cast<int32_t>(s.toExpertMajor.size());
  s.toSourceMajor.assign(s.toExpertMajor.size(), 0);
  for (size_t r = 0; r < s.toExpertMajor.size(); ++r) s.toSourceMajor[s.toExpertMajor[r]] = static_cast<int32_t>(r);
}

float MoeLayer::forward(MoeState& s, void* out, const void* x, int N, const MoeParams& params) {
  const int E = shape_.experts, C = shape_.channels, F = shape_.hidden, k = shape_.topk;
  s.tokens = N;
  // The router's logits, routed on the host.
  Tensor logits = rows(N, E);
  ops_.matmulForward(logits.data(), x, params.router, nullptr, N, C, E);
  s.probs.assign(static_cast<size_t>(N) * E, 0.0f);
  ops_.downloadFloats(s.probs.data(), logits.data(), s.probs.size());
  route(s, N);
  const size_t S = s.sendTokens.size(), R = s.toExpertMajor.size();
  s.slotOfDevice = indices(s.slotOf);
  s.sendTokensDevice = indices(s.sendTokens);
  s.sendGatesDevice = floats(s.sendGates);
  s.toExpertMajorDevice = indices(s.toExpertMajor);
  s.toSourceMajorDevice = indices(s.toSourceMajor);
  // Dispatch.
  Tensor sourceMajor = rows(R, C);
  s.received = rows(R, C);
  if (shape_.dispatch != ExpertDispatch::kAllToAllv && ep_ > 1) {
    epDispatch(s, x, N);
  } else {
    s.dispatched = rows(S, C);
    ops_.gatherRows(s.dispatched.data(), x, s.sendTokensDevice.i32(), nullptr, static_cast<int>(S), C);
    exchange(s.dispatched.data(), s.sendRows, sourceMajor.data(), s.receiveRows);
    ops_.gatherRows(s.received.data(), sourceMajor.data(), s.toExpertMajorDevice.i32(), nullptr, static_cast<int>(R),
                    C);
  }
  // Each local expert's MLP over its rows.
  s.fc = rows(R, F);
  s.fcGelu = rows(R, F);
  s.expertOut = rows(R, C);
  for (int e = 0; e < localExperts(); ++e) {
    const int first = s.expertRows[e], n = s.expertRows[e + 1] - first;
    if (n == 0) continue;
    const void* fcw = elementAt(ops_, params.experts, e * expertElements());
    const void* fcb = elementAt(ops_, fcw, static_cast<size_t>(F) * C);
    const void* projw = elementAt(ops_, fcb, F);
    const void* projb = elementAt(ops_, projw, static_cast<size_t>(C) * F);
    void* fc = elementAt(ops_, s.fc.data(), static_cast<size_t>(first) * F);
    void* fcGelu = elementAt(ops_, s.fcGelu.data(), static_cast<size_t>(first) * F);
    ops_.matmulForward(fc, elementAt(ops_, s.received.data(), static_cast<size_t>(first) * C), fcw, fcb, n, C, F);
    ops_.geluForward(fcGelu, fc, static_cast<size_t>(n) * F);
    ops_.matmulForward(elementAt(ops_, s.expertOut.data(), static_cast<size_t>(first) * C), fcGelu, projw, projb, n, F,
                       C);
  }
  // Combine: back in the order sent, then each token's outputs weighted by its gates.
  ops_.gatherRows(sourceMajor.data(), s.expertOut.data(), s.toSourceMajorDevice.i32(), nullptr, static_cast<int>(R), C);
  s.returned = rows(S, C);
  exchange(sourceMajor.data(), s.receiveRows, s.returned.data(), s.sendRows);
  Tensor gates = floats(s.gates);
  ops_.zero(out, static_cast<size_t>(N) * C * ops_.elementBytes());
  ops_.combineRows(out, s.returned.data(), s.slotOfDevice.i32(), gates.f32(), N, k, C);
  return s.auxLoss;
}

void MoeLayer::backward(MoeState& s, void* dx, const void* dout, const void* x, const MoeParams& params,
                        const MoeGrads& grads, float lossScale, bool input, bool weights) {
  const int E = shape_.experts, C = shape_.channels, F = shape_.hidden, k = shape_.topk, N = s.tokens;
  const size_t S = s.sendTokens.size(), R = s.toExpertMajor.size();
  // Each expert's layers: the input's gradient (B), the weights' (W), or both.
  auto experts = [&](bool withInput, bool withWeights, void* dReceived) {
    for (int e = 0; e < localExperts(); ++e) {
      const int first = s.expertRows[e], n = s.expertRows[e + 1] - first;
      if (n == 0) continue;
      const size_t at = e * expertElements();
      const void* fcw = elementAt(ops_, params.experts, at);
      const void* projw = elementAt(ops_, fcw, static_cast<size_t>(F) * C + F);
      void* dfcw = withWeights ? elementAt(ops_, grads.experts, at) : nullptr;
      void* dfcb = withWeights ? elementAt(ops_, dfcw, static_cast<size_t>(F) * C) : nullptr;
      void* dprojw = withWeights ? elementAt(ops_, dfcb, F) : nullptr;
      void* dprojb = withWeights ? elementAt(ops_, dprojw, static_cast<size_t>(C) * F) : nullptr;
      const void* dOut = elementAt(ops_, s.dExpertOut.data(), static_cast<size_t>(first) * C);
      void* dFc = elementAt(ops_, s.dFc.data(), static_cast<size_t>(first) * F);
      const void* fc = elementAt(ops_, s.fc.data(), static_cast<size_t>(first) * F);
      const void* fcGelu = elementAt(ops_, s.fcGelu.data(), static_cast<size_t>(first) * F);
      if (withInput) {  // through GELU into dFc, kept for W
        Tensor dGelu = rows(n, F);
        ops_.matmulBackward(dGelu.data(), nullptr, nullptr, dOut, fcGelu, projw, n, F, C);
        ops_.geluBackward(dFc, dGelu.data(), fc, static_cast<size_t>(n) * F);
        ops_.matmulBackward(elementAt(ops_, dReceived, static_cast<size_t>(first) * C), nullptr, nullptr, dFc,
                            elementAt(ops_, s.received.data(), static_cast<size_t>(first) * C), fcw, n, C, F);
      }
      if (withWeights) {
        ops_.matmulBackward(nullptr, dprojw, dprojb, dOut, fcGelu, projw, n, F, C);
        ops_.matmulBackward(nullptr, dfcw, dfcb, dFc,
                            elementAt(ops_, s.received.data(), static_cast<size_t>(first) * C), fcw, n, C, F);
      }
    }
  };
  if (!input) {  // W: the weights' gradients from what B kept
    experts(false, true, nullptr);
    ops_.matmulBackward(nullptr, grads.router, nullptr, s.dlogits.data(), x, params.router, N, C, E);
    return;
  }
  // The gates' gradients: each row's output against the token's output gradient.
  Tensor gateDots = Tensor::zeros({static_cast<int64_t>(S)}, DType::kFloat32, &ops_);
  ops_.rowDots(gateDots.f32(), dout, s.sendTokensDevice.i32(), s.returned.data(), static_cast<int>(S), C);
  std::vector<float> dSendGates(S);
  if (S > 0) ops_.download(dSendGates.data(), gateDots.data(), S * sizeof(float));
  // The rows' gradients, through the combine's exchange, to the experts.
  Tensor dReturned = rows(S, C);
  ops_.gatherRows(dReturned.data(), dout, s.sendTokensDevice.i32(), s.sendGatesDevice.f32(), static_cast<int>(S), C);
  Tensor sourceMajor = rows(R, C);
  exchange(dReturned.data(), s.sendRows, sourceMajor.data(), s.receiveRows);
  s.dExpertOut = rows(R, C);
  ops_.gatherRows(s.dExpertOut.data(), sourceMajor.data(), s.toExpertMajorDevice.i32(), nullptr, static_cast<int>(R),
                  C);
  s.dFc = rows(R, F);
  Tensor dReceived = rows(R, C);
  experts(true, weights, dReceived.data());
  // Back through the dispatch's exchange, summed into each token's input gradient.
  ops_.gatherRows(sourceMajor.data(), dReceived.data(), s.toSourceMajorDevice.i32(), nullptr, static_cast<int>(R), C);
  Tensor dDispatched = rows(S, C);
  exchange(sourceMajor.data(), s.receiveRows, dDispatched.data(), s.sendRows);
  ops_.combineRows(dx, dDispatched.data(), s.slotOfDevice.i32(), nullptr, N, k, C);
  // The router: the gates' and the load-balancing loss's gradients through the softmax.
  std::vector<float> dprobs(static_cast<size_t>(N) * E, 0.0f);
  for (int a = 0; a < N * k; ++a)
    if (s.slotOf[a] >= 0) dprobs[static_cast<size_t>(a / k) * E + s.choice[a]] += dSendGates[s.slotOf[a]];
  for (int t = 0; t < N; ++t)
    for (int e = 0; e < E; ++e)
      dprobs[static_cast<size_t>(t) * E + e] +=
          static_cast<float>(lossScale * shape_.auxLossCoefficient * E * s.routedFraction[e] / N);
  std::vector<float> dlogits(dprobs.size());
  for (int t = 0; t < N; ++t) {
    const float* p = s.probs.data() + static_cast<size_t>(t) * E;
    const float* dp = dprobs.data() + static_cast<size_t>(t) * E;
    double inner = 0;
    for (int e = 0; e < E; ++e) inner += static_cast<double>(p[e]) * dp[e];
    for (int e = 0; e < E; ++e) dlogits[static_cast<size_t>(t) * E + e] = static_cast<float>(p[e] * (dp[e] - inner));
  }
  s.dlogits = rows(N, E);
  ops_.uploadFloats(s.dlogits.data(), dlogits.data(), dlogits.size());
  ops_.matmulBackward(dx, weights ? grads.router : nullptr, nullptr, s.dlogits.data(), x, params.router, N, C, E);
}

}  // namespace loom::parallel
