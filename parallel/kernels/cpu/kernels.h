// The CPU kernels of the reference GPT, forward and backward, in fp32. The CUDA kernels (parallel/kernels/cuda) take
// the same names and arguments, plus a stream. Layout is row-major: activations are [B, T, C] (batch, time,
// channels), linear weights [out, in] as PyTorch keeps them. Every backward ADDS into its gradients, so a step zeroes
// them once and the backward of a layer used twice (the tied token embedding) sums; dinp is written the same way.
// One thread: parallelism is the strategies' business, and the benchmarks compare against one-thread PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::parallel::cpu {

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]; wte is [V, C], wpe [maxT, C] with T <= maxT. A negative token
// has no row here (a vocabulary-parallel table's token of another rank): out is wpe's alone, and the backward adds
// nothing to wte for it.
void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// V: the token table's rows (every token is below it).
void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int V);

// Over the last dimension of N rows of C: out = (inp - mean) * rstd * weight + bias, with the biased variance and
// eps 1e-5 (torch.nn.LayerNorm's). mean and rstd [N] are kept for the backward.
void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      int N, int C);
void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C);

// out[N, OC] = inp[N, C] x weight[OC, C]^T + bias[OC] (bias may be null), through BLAS (cblas_sgemm).
void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
// dinp[N, C] += dout x weight; dweight[OC, C] += dout^T x inp; dbias[OC] += column sums of dout (when not null).
void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC);

// Causal multi-head self-attention. inp [B, T, 3C] holds q, k and v side by side (the QKV projection's output), NH
// heads of C / NH channels each; out [B, T, C] the heads' outputs side by side; att [B, NH, T, T] the softmax
// probabilities (zero above the diagonal), kept for the backward. Scores are scaled by 1 / sqrt(C / NH).
void attentionForward(float* out, float* att, const float* inp, int B, int T, int C, int NH);
void attentionBackward(float* dinp, const float* dout, const float* inp, const float* att, int B, int T, int C, int NH);

// GELU with the tanh approximation (GPT-2's; torch.nn.functional.gelu(x, approximate="tanh")).
void geluForward(float* out, const float* inp, size_t n);
void geluBackward(float* dinp, const float* dout, const float* inp, size_t n);

// out = a + b; the backward passes dout to both.
void residualForward(float* out, const float* a, const float* b, size_t n);
void residualBackward(float* da, float* db, const float* dout, size_t n);

// Fused softmax and cross-entropy over N rows of V logits: probs [N, V], losses[i] = -log probs[i, targets[i]].
void crossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V);
// dlogits[i, :] += (probs[i, :] - onehot(targets[i])) * dlosses[i]; a target outside [0, V) has no one-hot here.
void crossEntropyBackward(float* dlogits, const float* dlosses, const float* probs, const int32_t* targets, int N,
                          int V);

// The same forward in three steps for logits split by vocabulary over ranks (Megatron's vocabulary-parallel
// cross-entropy), each rank holding V of the columns, with three all-reduces between them: crossEntropyMax gives
// each row's maximum (all-reduce max); crossEntropyExp writes probs = exp(logit - max), each row's sum of them and
// the target's logit - max where the target is one of this rank's columns, else 0 (all-reduce sum of both);
// crossEntropyFinish divides the probabilities by the sum and writes losses = log(sum) - (target logit - max).
void crossEntropyMax(float* maxes, const float* logits, int N, int V);
void crossEntropyExp(float* sums, float* targetLogits, float* probs, const float* logits, const float* maxes,
                     const int32_t* targets, int N, int V);
void crossEntropyFinish(float* losses, float* probs, const float* sums, const float* targetLogits, int N, int V);

// One AdamW step on n parameters (torch.optim.AdamW's: decoupled weight decay, bias-corrected moments), each
// gradient multiplied by gradScale first (the clipping factor). `step` counts from 1.
void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate, float beta1,
                 float beta2, float eps, float weightDecay, int step, float gradScale = 1.0f);

// The sum of squares of n gradients, accumulated in double: a rank's share of the global norm.
double sumOfSquares(const float* grads, size_t n);
// The factor clip_grad_norm_ scales every gradient by: maxNorm / (norm + 1e-6), at most 1.
float clipFactor(double globalSumOfSquares, float maxNorm);
void scale(float* values, size_t n, float factor);

// The mixture-of-experts layer's row movements, rows of C values. gatherRows: out[i] = scales[i] inp[rows[i]]
// (scales null: 1), the dispatch of tokens to their experts' rows and the combine's backward. combineRows: out[t] +=
// the sum over j of gates[t k + j] inp[slots[t k + j]], slots below 0 skipped (gates null: 1), the combine of each
// token's k expert outputs and the dispatch's backward; summed in fp32 in the order of j, then added. rowDots:
// out[i] = a[rows[i]] . b[i] (fp32, summed in double), the gates' gradients.
void gatherRows(float* out, const float* inp, const int32_t* rows, const float* scales, int n, int C);
void combineRows(float* out, const float* inp, const int32_t* slots, const float* gates, int tokens, int k, int C);
void rowDots(float* out, const float* a, const int32_t* rows, const float* b, int n, int C);

}  // namespace loom::parallel::cpu
