// The CUDA kernels of the reference GPT: the names, arguments and semantics of parallel/kernels/cpu/kernels.h, each
// with a last argument for the cudaStream_t (as void*, so that callers need no CUDA headers), in fp32 and in bf16
// (parallel/bf16.h). Every pointer is device memory; backwards add into their gradients as the CPU ones do.
//
// In bf16, activations, parameters and gradients are stored in bf16 and every kernel computes in fp32 (loads
// widen, stores round to nearest even); layernorm's statistics and the per-position losses stay fp32, and GEMMs
// run in cuBLAS with bf16 inputs and fp32 accumulation. AdamW then keeps fp32 master weights and moments and writes
// the rounded weights back: the mixed precision of the ZeRO paper, 2 + 2 + 12 bytes per parameter.
//
// GEMMs go through cuBLAS (one handle per thread and device). tests/gpu/parallel_kernels_test.cc holds each to its
// CPU reference on a device. Built where the build has CUDA (LOOM_PARALLEL_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "parallel/bf16.h"

namespace loom::parallel::cuda {

// Every template below is instantiated for E = float and E = Bf16 (in kernels.cu and loss_optimizer.cu), the
// element type of activations, parameters and gradients. Layernorm's statistics (mean and rstd [N]) and the
// per-position losses and their gradients [N] are fp32 in both.

template <typename E>
void embeddingForward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int B, int T, int C, void* stream);
// Adds into the token rows with atomicAdd (so the token embedding's gradient is not bitwise reproducible run to
// run), in bf16 through an fp32 buffer added once, and sums each position's rows in order.
template <typename E>
void embeddingBackward(E* dwte, E* dwpe, const E* dout, const int32_t* tokens, int B, int T, int C, int V,
                       void* stream);

template <typename E>
void layernormForward(E* out, float* mean, float* rstd, const E* inp, const E* weight, const E* bias, int N, int C,
                      void* stream);
// The weight and bias gradients are column sums over the rows in a fixed order (partial sums over chunks of rows,
// then the chunks in order), so they are bitwise reproducible.
template <typename E>
void layernormBackward(E* dinp, E* dweight, E* dbias, const E* dout, const E* inp, const E* weight, const float* mean,
                       const float* rstd, int N, int C, void* stream);

// bias and dbias may be null.
template <typename E>
void matmulForward(E* out, const E* inp, const E* weight, std::type_identity_t<const E*> bias, int N, int C, int OC,
                   void* stream);
template <typename E>
void matmulBackward(E* dinp, E* dweight, std::type_identity_t<E*> dbias, const E* dout, const E* inp, const E* weight,
                    int N, int C, int OC, void* stream);

// `att` [B, NH, T, T] as on the CPU; the backward also needs `scratch`, B x NH x T x T elements.
template <typename E>
void attentionForward(E* out, E* att, const E* inp, int B, int T, int C, int NH, void* stream);
template <typename E>
void attentionBackward(E* dinp, const E* dout, const E* inp, const E* att, E* scratch, int B, int T, int C, int NH,
                       void* stream);

template <typename E>
void geluForward(E* out, const E* inp, size_t n, void* stream);
template <typename E>
void geluBackward(E* dinp, const E* dout, const E* inp, size_t n, void* stream);
template <typename E>
void residualForward(E* out, const E* a, const E* b, size_t n, void* stream);
template <typename E>
void residualBackward(E* da, E* db, const E* dout, size_t n, void* stream);

template <typename E>
void crossEntropyForward(float* losses, E* probs, const E* logits, const int32_t* targets, int N, int V, void* stream);
template <typename E>
void crossEntropyBackward(E* dlogits, const float* dlosses, const E* probs, const int32_t* targets, int N, int V,
                          void* stream);

// The vocabulary-parallel cross-entropy's three steps (parallel/kernels/cpu/kernels.h).
template <typename E>
void crossEntropyMax(float* maxes, const E* logits, int N, int V, void* stream);
template <typename E>
void crossEntropyExp(float* sums, float* targetLogits, E* probs, const E* logits, const float* maxes,
                     const int32_t* targets, int N, int V, void* stream);
template <typename E>
void crossEntropyFinish(float* losses, E* probs, const float* sums, const float* targetLogits, int N, int V,
                        void* stream);

// Adds the sum of squares of n gradients to *sum (device memory, a double), for the global norm: per-block sums,
// then those in a fixed order, so that it is bitwise reproducible.
template <typename E>
void sumOfSquares(double* sum, const E* grads, size_t n, void* stream);
template <typename E>
void scale(E* values, size_t n, float factor, void* stream);
// The mixture-of-experts layer's row movements; the sums in fp32, rowDots' in each thread's order over C.
template <typename E>
void gatherRows(E* out, const E* inp, const int32_t* rows, const float* scales, int n, int C, void* stream);
template <typename E>
void combineRows(E* out, const E* inp, const int32_t* slots, const float* gates, int tokens, int k, int C,
                 void* stream);
template <typename E>
void rowDots(float* out, const E* a, const int32_t* rows, const E* b, int n, int C, void* stream);

// One AdamW step (torch.optim.AdamW's), fp32 throughout, each gradient multiplied by gradScale first (the clipping
// factor).
void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate, float beta1,
                 float beta2, float eps, float weightDecay, int step, float gradScale, void* stream);
// The same step on fp32 master weights from bf16 gradients; `params`, the bf16 weights the model computes with,
// get the new master weights rounded.
void adamwUpdate(Bf16* params, const Bf16* grads, float* master, float* m, float* v, size_t n, float learningRate,
                 float beta1, float beta2, float eps, float weightDecay, int step, float gradScale, void* stream);

// Whether the last kernel launch on this thread failed; *message says how (empty when none did).
bool launchFailed(const char** message);

}  // namespace loom::parallel::cuda
