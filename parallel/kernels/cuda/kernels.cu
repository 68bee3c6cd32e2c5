// The reference GPT's CUDA kernels (kernels.h). Element-wise kernels are grid-stride loops; row kernels (layernorm,
// softmax, cross-entropy) give a row to a warp or a block and reduce with shuffles; the GEMMs, attention's included
// (strided-batched over the heads of one sequence), are cuBLAS calls on the row-major layout read as column-major.
// Parameter gradients that many rows add to (layernorm's, the embeddings') use atomicAdd, so their sums are not
// bitwise reproducible from run to run; everything else is.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "parallel/kernels/cuda/kernels.h"

namespace loom::parallel::cuda {
namespace {

constexpr int kThreads = 256;

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned blocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

__device__ size_t firstIndex() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t gridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

__device__ float warpSum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ float warpMax(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}
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

// The calling thread's cuBLAS handle for its current device, bound to `stream`. A failure to make one ends the
// program: every GEMM would fail after it.
cublasHandle_t blas(void* stream) {
  thread_local cublasHandle_t handles[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  cublasHandle_t& handle = handles[device % 64];
  if (handle == nullptr && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "parallel/kernels/cuda: cublasCreate failed on device %d\n", device);
    std::exit(1);
  }
  cublasSetStream(handle, asStream(stream));
  return handle;
}

void check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "parallel/kernels/cuda: %s failed (cuBLAS status %d)\n", what, static_cast<int>(status));
  std::exit(1);
}

__global__ void embeddingForwardKernel(float* out, const int32_t* tokens, const float* wte, const float* wpe, int T,
                                       int C, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / C, c = i % C;
    out[i] = wte[static_cast<size_t>(tokens[row]) * C + c] + wpe[(row % T) * C + c];
  }
}

__global__ void embeddingBackwardKernel(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int T,
                                        int C, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / C, c = i % C;
    atomicAdd(&dwte[static_cast<size_t>(tokens[row]) * C + c], dout[i]);
    atomicAdd(&dwpe[(row % T) * C + c], dout[i]);
  }
}

// One warp per row.
__global__ void layernormForwardKernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                       const float* bias, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += x[c];
  const float mu = warpSum(sum) / C;
  float squares = 0;
  for (int c = lane; c < C; c += 32) squares += (x[c] - mu) * (x[c] - mu);
  const float r = rsqrtf(warpSum(squares) / C + 1e-5f);
  float* y = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = (x[c] - mu) * r * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

__global__ void layernormBackwardKernel(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  const float* dy = dout + static_cast<size_t>(row) * C;
  const float mu = mean[row], r = rstd[row];
  float sumG = 0, sumGXhat = 0;
  for (int c = lane; c < C; c += 32) {
    const float g = dy[c] * weight[c];
    sumG += g;
    sumGXhat += g * (x[c] - mu) * r;
  }
  const float meanG = warpSum(sumG) / C, meanGXhat = warpSum(sumGXhat) / C;
  float* dx = dinp + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (x[c] - mu) * r;
    dx[c] += r * (dy[c] * weight[c] - meanG - xhat * meanGXhat);
    atomicAdd(&dweight[c], dy[c] * xhat);
    atomicAdd(&dbias[c], dy[c]);
  }
}

__global__ void addBiasKernel(float* out, const float* bias, int OC, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] += bias[i % OC];
}

// dbias[o] += sum over rows of dout[row, o]: a thread per column, rows in order.
__global__ void biasGradientKernel(float* dbias, const float* dout, int N, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float sum = 0;
  for (int i = 0; i < N; ++i) sum += dout[static_cast<size_t>(i) * OC + o];
  dbias[o] += sum;
}

// Causal softmax of each row t of a T x T block, in place; zero above the diagonal. One warp per row.
__global__ void causalSoftmaxKernel(float* att, int T, size_t rows) {
  const size_t row = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* p = att + row * T;
  float maxScore = -INFINITY;
  for (int s = lane; s <= t; s += 32) maxScore = fmaxf(maxScore, p[s]);
  maxScore = warpMax(maxScore);
  float sum = 0;
  for (int s = lane; s <= t; s += 32) {
    p[s] = expf(p[s] - maxScore);
    sum += p[s];
  }
  const float inverse = 1.0f / warpSum(sum);
  for (int s = lane; s < T; s += 32) p[s] = s <= t ? p[s] * inverse : 0.0f;
}

// dS = P * (dP - rowsum(P * dP)) * scale, in place over dP; one warp per row.
__global__ void softmaxBackwardKernel(float* d, const float* att, int T, float scale, size_t rows) {
  const size_t row = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const float* p = att + row * T;
  float* g = d + row * T;
  float weighted = 0;
  for (int s = lane; s <= t; s += 32) weighted += p[s] * g[s];
  weighted = warpSum(weighted);
  for (int s = lane; s < T; s += 32) g[s] = s <= t ? p[s] * (g[s] - weighted) * scale : 0.0f;
}

__device__ float geluTanh(float x) { return tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)); }

__global__ void geluForwardKernel(float* out, const float* inp, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = 0.5f * inp[i] * (1.0f + geluTanh(inp[i]));
}

__global__ void geluBackwardKernel(float* dinp, const float* dout, const float* inp, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const float x = inp[i], th = geluTanh(x);
    const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
  }
}

__global__ void residualForwardKernel(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = a[i] + b[i];
}

__global__ void residualBackwardKernel(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// One block per row.
__global__ void crossEntropyForwardKernel(float* losses, float* probs, const float* logits, const int32_t* targets,
                                          int V) {
  const size_t row = blockIdx.x;
  const float* z = logits + row * V;
  float* p = probs + row * V;
  float maxLogit = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) maxLogit = fmaxf(maxLogit, z[v]);
  maxLogit = blockReduce<true>(maxLogit);
  float sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    p[v] = expf(z[v] - maxLogit);
    sum += p[v];
  }
  sum = blockReduce<false>(sum);
  const float inverse = 1.0f / sum;
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inverse;
  if (threadIdx.x == 0) losses[row] = logf(sum) - (z[targets[row]] - maxLogit);
}

__global__ void crossEntropyBackwardKernel(float* dlogits, const float* dlosses, const float* probs,
                                           const int32_t* targets, int V, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / V;
    const int v = static_cast<int>(i % V);
    dlogits[i] += (probs[i] - (v == targets[row] ? 1.0f : 0.0f)) * dlosses[row];
  }
}

__global__ void adamwKernel(float* params, const float* grads, float* m, float* v, size_t n, float learningRate,
                            float beta1, float beta2, float eps, float weightDecay, float correction1,
                            float correction2) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const float g = grads[i];
    float p = params[i];
    p -= learningRate * weightDecay * p;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - learningRate * (mi / correction1) / (sqrtf(vi / correction2) + eps);
  }
}

__global__ void sumOfSquaresKernel(double* sum, const float* grads, size_t n) {
  float local = 0;
  for (size_t i = firstIndex(); i < n; i += gridStride()) local += grads[i] * grads[i];
  local = blockReduce<false>(local);
  if (threadIdx.x == 0) atomicAdd(sum, static_cast<double>(local));
}

__global__ void scaleKernel(float* values, size_t n, float factor) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) values[i] *= factor;
}

}  // namespace

void embeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                      void* stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  embeddingForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(out, tokens, wte, wpe, T, C, n);
}

void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                       void* stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  embeddingBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dwte, dwpe, dout, tokens, T, C, n);
}

void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      int N, int C, void* stream) {
  const int rowsPerBlock = kThreads / 32;
  layernormForwardKernel<<<(N + rowsPerBlock - 1) / rowsPerBlock, kThreads, 0, asStream(stream)>>>(
      out, mean, rstd, inp, weight, bias, N, C);
}

void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int N, int C, void* stream) {
  const int rowsPerBlock = kThreads / 32;
  layernormBackwardKernel<<<(N + rowsPerBlock - 1) / rowsPerBlock, kThreads, 0, asStream(stream)>>>(
      dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

// Row-major X[rows, cols] is column-major X^T: out = inp x W^T is out^T = W x inp^T in cuBLAS's terms.
void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                   void* stream) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemm(blas(stream), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C, &zero, out, OC),
        "matmul forward");
  if (bias != nullptr) {
    const size_t n = static_cast<size_t>(N) * OC;
    addBiasKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(out, bias, OC, n);
  }
}

void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int N, int C, int OC, void* stream) {
  const float one = 1.0f;
  cublasHandle_t handle = blas(stream);
  check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &one, dinp, C),
        "matmul backward (input)");
  check(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dweight, C),
        "matmul backward (weight)");
  if (dbias != nullptr) biasGradientKernel<<<(OC + kThreads - 1) / kThreads, kThreads, 0, asStream(stream)>>>(
      dbias, dout, N, OC);
}

// Per sequence b, over its NH heads at once (strided-batched, head h's columns hs apart): S = scale Q K^T into att,
// the causal softmax, then Y = P V.
void attentionForward(float* out, float* att, const float* inp, int B, int T, int C, int NH, void* stream) {
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs)), one = 1.0f, zero = 0.0f;
  const long long block = static_cast<long long>(T) * T;
  cublasHandle_t handle = blas(stream);
  for (int b = 0; b < B; ++b) {
    const float* q = inp + static_cast<size_t>(b) * T * ld;
    float* s = att + static_cast<size_t>(b) * NH * block;
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &scale, q + C, ld, hs, q, ld, hs,
                                    &zero, s, T, block, NH),
          "attention scores");
  }
  const size_t rows = static_cast<size_t>(B) * NH * T;
  causalSoftmaxKernel<<<static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0,
                        asStream(stream)>>>(att, T, rows);
  for (int b = 0; b < B; ++b) {
    const float* v = inp + static_cast<size_t>(b) * T * ld + 2 * C;
    const float* p = att + static_cast<size_t>(b) * NH * block;
    float* y = out + static_cast<size_t>(b) * T * C;
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, v, ld, hs, p, T, block, &zero,
                                    y, C, hs, NH),
          "attention output");
  }
}

// dP = dY V^T, dS = softmax backward (in scratch), dQ += dS K, dK += dS^T Q, dV += P^T dY.
void attentionBackward(float* dinp, const float* dout, const float* inp, const float* att, float* scratch, int B, int T,
                       int C, int NH, void* stream) {
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs)), one = 1.0f, zero = 0.0f;
  const long long block = static_cast<long long>(T) * T;
  cublasHandle_t handle = blas(stream);
  for (int b = 0; b < B; ++b) {
    const float* v = inp + static_cast<size_t>(b) * T * ld + 2 * C;
    const float* dy = dout + static_cast<size_t>(b) * T * C;
    float* d = scratch + static_cast<size_t>(b) * NH * block;
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one, v, ld, hs, dy, C, hs, &zero, d,
                                    T, block, NH),
          "attention backward (dP)");
  }
  const size_t rows = static_cast<size_t>(B) * NH * T;
  softmaxBackwardKernel<<<static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0,
                          asStream(stream)>>>(scratch, att, T, scale, rows);
  for (int b = 0; b < B; ++b) {
    const size_t first = static_cast<size_t>(b) * T * ld;
    const float* q = inp + first;
    const float* k = q + C;
    const float* p = att + static_cast<size_t>(b) * NH * block;
    const float* ds = scratch + static_cast<size_t>(b) * NH * block;
    const float* dy = dout + static_cast<size_t>(b) * T * C;
    float* dq = dinp + first;
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one, k, ld, hs, ds, T, block, &one,
                                    dq, ld, hs, NH),
          "attention backward (dQ)");
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, q, ld, hs, ds, T, block, &one,
                                    dq + C, ld, hs, NH),
          "attention backward (dK)");
    check(cublasSgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one, dy, C, hs, p, T, block, &one,
                                    dq + 2 * C, ld, hs, NH),
          "attention backward (dV)");
  }
}

void geluForward(float* out, const float* inp, size_t n, void* stream) {
  geluForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(out, inp, n);
}
void geluBackward(float* dinp, const float* dout, const float* inp, size_t n, void* stream) {
  geluBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dinp, dout, inp, n);
}
void residualForward(float* out, const float* a, const float* b, size_t n, void* stream) {
  residualForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(out, a, b, n);
}
void residualBackward(float* da, float* db, const float* dout, size_t n, void* stream) {
  residualBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(da, db, dout, n);
}

void crossEntropyForward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V,
                         void* stream) {
  crossEntropyForwardKernel<<<N, kThreads, 0, asStream(stream)>>>(losses, probs, logits, targets, V);
}
void crossEntropyBackward(float* dlogits, const float* dlosses, const float* probs, const int32_t* targets, int N,
                          int V, void* stream) {
  const size_t n = static_cast<size_t>(N) * V;
  crossEntropyBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dlogits, dlosses, probs, targets, V, n);
}

void adamwUpdate(float* params, const float* grads, float* m, float* v, size_t n, float learningRate, float beta1,
                 float beta2, float eps, float weightDecay, int step, void* stream) {
  const float correction1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float correction2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamwKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(params, grads, m, v, n, learningRate, beta1, beta2, eps,
                                                               weightDecay, correction1, correction2);
}

void sumOfSquares(double* sum, const float* grads, size_t n, void* stream) {
  sumOfSquaresKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(sum, grads, n);
}

void scale(float* values, size_t n, float factor, void* stream) {
  scaleKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(values, n, factor);
}

bool launchFailed(const char** message) {
  const cudaError_t error = cudaGetLastError();
  *message = error == cudaSuccess ? "" : cudaGetErrorString(error);
  return error != cudaSuccess;
}

}  // namespace loom::parallel::cuda
