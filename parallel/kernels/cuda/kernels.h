// The CUDA kernels of the reference GPT: the names, arguments and semantics of parallel/kernels/cpu/kernels.h, fp32,
// each with a last argument for the cudaStream_t (as void*, so that callers need no CUDA headers). Every pointer is
// device memory; backwards add into their gradients as the CPU ones do. GEMMs go through cuBLAS (one handle per
// thread and device). tests/gpu/parallel_kernels_test.cc holds each to its CPU reference on a device. Built where
// the build has CUDA (LOOM_PARALLEL_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::parallel::cuda {

void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                      void* stream);
void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                       void* stream);

void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      int N, int C, void* stream);
void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C, void* stream);

void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                   void* stream);
void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC, void* stream);

// `att` [B, NH, T, T] as on the CPU; the backward also needs `scratch`, B x NH x T x T floats.
void attentionForward(float* out, float* att, const float* inp, int B, int T, int C, int NH, void* stream);
void attentionBackward(float* dinp, const float* dout, const float* inp, const float* att, float* scratch, int B, int T,
                       int C, int NH, void* stream);

void geluForward(float* out, const float* inp, size_t n, void* stream);
void geluBackward(float* dinp, const float* dout, const float* inp, size_t n, void* stream);
void residualForward(float* out, const float* a, const float* b, size_t n, void* stream);
void residualBackward(float* da, float* db, const float* dout, size_t n, void* stream);

void crossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V,
                         void* stream);
void crossEntropyBackward(float* dlogits, const float* dlosses, const float* probs, const int32_t* targets, int N,
                          int V, void* stream);

void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate, float beta1,
                 float beta2, float eps, float weightDecay, int step, void* stream);
// Adds the sum of squares of n gradients to *sum (device memory, a double), for the global norm.
void sumOfSquares(double* sum, const float* grads, size_t n, void* stream);
void scale(float* values, size_t n, float factor, void* stream);

// Whether the last kernel launch on this thread failed; *message says how (empty when none did).
bool launchFailed(const char** message);

}  // namespace loom::parallel::cuda
