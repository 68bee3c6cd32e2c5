// The reference GPT's loss and optimizer kernels (kernels.h; kernels.cu has the layers'): the cross-entropy, of
// whole rows or in the vocabulary-parallel steps, the gradients' sum of squares and scaling, and AdamW (fp32, or
// bf16 weights with fp32 master weights). Row reductions give a row to a block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "parallel/kernels/cuda/kernel_common.h"
#include "parallel/kernels/cuda/kernels.h"

namespace loom::parallel::cuda {

using namespace detail;

namespace {

// A block's sum or max (blockDim.x a multiple of 32, at most 1024), every thread getting it.
template <bool kMax>
__device__ float blockReduce(float value) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = kMax ? warpMax(value) : warpSum(value);
  __syncthreads();  // partial may still be read from an earlier call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  value = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warpMax(value) : warpSum(value);
}

// One block per row.
template <typename D>
__global__ void crossEntropyForwardKernel(float* losses, D* probs, const D* logits, const int32_t* targets, int V) {
  const size_t row = blockIdx.x;
  const D* z = logits + row * V;
  D* p = probs + row * V;
  float maxLogit = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) maxLogit = fmaxf(maxLogit, load(z[v]));
  maxLogit = blockReduce<true>(maxLogit);
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(load(z[v]) - maxLogit);
  sum = blockReduce<false>(sum);
  const float inverse = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = store<D>(expf(load(z[v]) - maxLogit) * inverse);
  if (threadIdx.x == 0) losses[row] = logf(sum) - (load(z[targets[row]]) - maxLogit);
}

// The vocabulary-parallel cross-entropy's steps (kernels.h), one block per row.
template <typename D>
__global__ void crossEntropyMaxKernel(float* maxes, const D* logits, int V) {
  const size_t row = blockIdx.x;
  float maxLogit = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) maxLogit = fmaxf(maxLogit, load(logits[row * V + v]));
  maxLogit = blockReduce<true>(maxLogit);
  if (threadIdx.x == 0) maxes[row] = maxLogit;
}

template <typename D>
__global__ void crossEntropyExpKernel(float* sums, float* targetLogits, D* probs, const D* logits, const float* maxes,
                                      const int32_t* targets, int V) {
  const size_t row = blockIdx.x;
  const float maxLogit = maxes[row];
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(load(logits[row * V + v]) - maxLogit);
    probs[row * V + v] = store<D>(p);
    sum += p;
  }
  sum = blockReduce<false>(sum);
  if (threadIdx.x != 0) return;
  sums[row] = sum;
  const int32_t target = targets[row];
  targetLogits[row] = target >= 0 && target < V ? load(logits[row * V + target]) - maxLogit : 0.0f;
}

template <typename D>
__global__ void crossEntropyFinishKernel(float* losses, D* probs, const float* sums, const float* targetLogits, int V,
                                         size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / V;
    probs[i] = store<D>(load(probs[i]) / sums[row]);
    if (i % V == 0) losses[row] = logf(sums[row]) - targetLogits[row];
  }
}

template <typename D>
__global__ void crossEntropyBackwardKernel(D* dlogits, const float* dlosses, const D* probs, const int32_t* targets,
                                           int V, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / V;
    const int v = static_cast<int>(i % V);
    addTo(&dlogits[i], (load(probs[i]) - (v == targets[row] ? 1.0f : 0.0f)) * dlosses[row]);
  }
}

struct AdamW {
  float learningRate, beta1, beta2, eps, weightDecay, correction1, correction2, gradScale;
  // The new value of weight p with gradient g (before scaling), updating the moments m and v.
  __device__ float step(float p, float g, float* m, float* v) const {
    g *= gradScale;
    p -= learningRate * weightDecay * p;
    const float mi = beta1 * *m + (1.0f - beta1) * g;
    const float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    return p - learningRate * (mi / correction1) / (sqrtf(vi / correction2) + eps);
  }
};

__global__ void adamwKernel(float* params, const float* grads, float* m, float* v, size_t n, AdamW adamw) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) params[i] = adamw.step(params[i], grads[i], &m[i], &v[i]);
}

__global__ void adamwMixedKernel(__nv_bfloat16* params, const __nv_bfloat16* grads, float* master, float* m, float* v,
                                 size_t n, AdamW adamw) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    master[i] = adamw.step(master[i], load(grads[i]), &m[i], &v[i]);
    params[i] = store<__nv_bfloat16>(master[i]);
  }
}

// Each block's sum of squares into partial[blockIdx.x].
template <typename D>
__global__ void sumOfSquaresKernel(double* partial, const D* grads, size_t n) {
  float local = 0;
  for (size_t i = firstIndex(); i < n; i += gridStride()) local += load(grads[i]) * load(grads[i]);
  local = blockReduce<false>(local);
  if (threadIdx.x == 0) partial[blockIdx.x] = static_cast<double>(local);
}

// *sum += the blocks' partial sums, in a fixed order: one block, each thread a strided run, then a tree.
__global__ void sumPartialsKernel(double* sum, const double* partial, unsigned blocks) {
  __shared__ double runs[kThreads];
  double local = 0;
  for (unsigned i = threadIdx.x; i < blocks; i += blockDim.x) local += partial[i];
  runs[threadIdx.x] = local;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) runs[threadIdx.x] += runs[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *sum += runs[0];
}

template <typename D>
__global__ void scaleKernel(D* values, size_t n, float factor) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) values[i] = store<D>(load(values[i]) * factor);
}

}  // namespace

template <typename E>
void crossEntropyForward(float* losses, E* probs, const E* logits, const int32_t* targets, int N, int V, void* stream) {
  crossEntropyForwardKernel<<<N, kThreads, 0, asStream(stream)>>>(losses, dev(probs), dev(logits), targets, V);
}
template <typename E>
void crossEntropyBackward(E* dlogits, const float* dlosses, const E* probs, const int32_t* targets, int N, int V,
                          void* stream) {
  const size_t n = static_cast<size_t>(N) * V;
  crossEntropyBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(dlogits), dlosses, dev(probs),
                                                                              targets, V, n);
}

template <typename E>
void crossEntropyMax(float* maxes, const E* logits, int N, int V, void* stream) {
  crossEntropyMaxKernel<<<N, kThreads, 0, asStream(stream)>>>(maxes, dev(logits), V);
}
template <typename E>
void crossEntropyExp(float* sums, float* targetLogits, E* probs, const E* logits, const float* maxes,
                     const int32_t* targets, int N, int V, void* stream) {
  crossEntropyExpKernel<<<N, kThreads, 0, asStream(stream)>>>(sums, targetLogits, dev(probs), dev(logits), maxes,
                                                              targets, V);
}
template <typename E>
void crossEntropyFinish(float* losses, E* probs, const float* sums, const float* targetLogits, int N, int V,
                        void* stream) {
  const size_t n = static_cast<size_t>(N) * V;
  crossEntropyFinishKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(losses, dev(probs), sums, targetLogits, V,
                                                                            n);
}

template <typename E>
void sumOfSquares(double* sum, const E* grads, size_t n, void* stream) {
  cudaStream_t s = asStream(stream);
  const unsigned blocks = blocksFor(n);
  double* partial = nullptr;
  mustAllocate(reinterpret_cast<void**>(&partial), sizeof(double) * blocks, s, "the sum of squares' partial sums");
  sumOfSquaresKernel<<<blocks, kThreads, 0, s>>>(partial, dev(grads), n);
  sumPartialsKernel<<<1, kThreads, 0, s>>>(sum, partial, blocks);
  cudaFreeAsync(partial, s);
}
template <typename E>
void scale(E* values, size_t n, float factor, void* stream) {
  scaleKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(values), n, factor);
}

namespace {
AdamW adamwOf(float learningRate, float beta1, float beta2, float eps, float weightDecay, int step, float gradScale) {
  return AdamW{learningRate,
               beta1,
               beta2,
               eps,
               weightDecay,
               1.0f - std::pow(beta1, static_cast<float>(step)),
               1.0f - std::pow(beta2, static_cast<float>(step)),
               gradScale};
}
}  // namespace

void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate, float beta1,
                 float beta2, float eps, float weightDecay, int step, float gradScale, void* stream) {
  adamwKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(
      params, grads, m, v, n, adamwOf(learningRate, beta1, beta2, eps, weightDecay, step, gradScale));
}

void adamwUpdate(Bf16* params, const Bf16* grads, float* master, float* m, float* v, size_t n, float learningRate,
                 float beta1, float beta2, float eps, float weightDecay, int step, float gradScale, void* stream) {
  adamwMixedKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(
      dev(params), dev(grads), master, m, v, n, adamwOf(learningRate, beta1, beta2, eps, weightDecay, step, gradScale));
}

// The two element types of kernels.h.
#define LOOM_INSTANTIATE(E)                                                                                   \
  template void crossEntropyForward(float*, E*, const E*, const int32_t*, int, int, void*);                   \
  template void crossEntropyBackward(E*, const float*, const E*, const int32_t*, int, int, void*);            \
  template void crossEntropyMax(float*, const E*, int, int, void*);                                           \
  template void crossEntropyExp(float*, float*, E*, const E*, const float*, const int32_t*, int, int, void*); \
  template void crossEntropyFinish(float*, E*, const float*, const float*, int, int, void*);                  \
  template void sumOfSquares(double*, const E*, size_t, void*);                                               \
  template void scale(E*, size_t, float, void*);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(Bf16)
#undef LOOM_INSTANTIATE

}  // namespace loom::parallel::cuda
