// The reference GPT's CUDA kernels (kernels.h), each a template over the stored element type (float or
// __nv_bfloat16) that computes in fp32. Element-wise kernels are grid-stride loops; row kernels (layernorm, softmax,
// cross-entropy) give a row to a warp or a block and reduce with shuffles; the GEMMs, attention's included
// (strided-batched over the heads of one sequence), are cuBLAS GemmEx calls with fp32 accumulation on the row-major
// layout read as column-major. Only the token embedding's gradient adds with atomics; every other result is
// bitwise reproducible from run to run.
//
// The layers' kernels are here; the loss's and the optimizer's are in loss_optimizer.cu, with what both share in
// kernel_common.h.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "parallel/kernels/cuda/kernel_common.h"
#include "parallel/kernels/cuda/kernels.h"

namespace loom::parallel::cuda {

using namespace detail;

namespace {

template <typename D>
constexpr cudaDataType_t blasType() {
  return std::is_same_v<D, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// The calling thread's cuBLAS handles, one per device, destroyed when the thread ends.
struct BlasHandles {
  cublasHandle_t handles[64] = {};
  ~BlasHandles() {
    for (cublasHandle_t handle : handles)
      if (handle != nullptr) cublasDestroy(handle);
  }
};

// The calling thread's cuBLAS handle for its current device, bound to `stream`. A failure to make one ends the
// program: every GEMM would fail after it.
cublasHandle_t blas(void* stream) {
  thread_local BlasHandles perThread;
  int device = 0;
  cudaGetDevice(&device);
  cublasHandle_t& handle = perThread.handles[device % 64];
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

template <typename D>
__global__ void embeddingForwardKernel(D* out, const int32_t* tokens, const D* wte, const D* wpe, int T, int C,
                                       size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / C, c = i % C;
    const int32_t id = tokens[row];  // negative: another rank's row of a vocabulary-parallel table
    const float token = id >= 0 ? load(wte[static_cast<size_t>(id) * C + c]) : 0.0f;
    out[i] = store<D>(token + load(wpe[(row % T) * C + c]));
  }
}

// Adds each position's gradient into its token's row of `sums` (fp32, or the fp32 gradient itself).
template <typename D>
__global__ void tokenEmbeddingBackwardKernel(float* sums, const D* dout, const int32_t* tokens, int C, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t row = i / C, c = i % C;
    if (tokens[row] >= 0) atomicAdd(&sums[static_cast<size_t>(tokens[row]) * C + c], load(dout[i]));
  }
}

// dst[i] += sums[i], one rounding (bf16 gradients from their fp32 sums).
template <typename D>
__global__ void addFloatsKernel(D* dst, const float* sums, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) addTo(&dst[i], sums[i]);
}

// A thread per (t, c) of the position embedding, over the B sequences in order.
template <typename D>
__global__ void positionEmbeddingBackwardKernel(D* dwpe, const D* dout, int B, int T, int C) {
  const size_t positions = static_cast<size_t>(T) * C;
  for (size_t i = firstIndex(); i < positions; i += gridStride()) {
    float sum = 0;
    for (int b = 0; b < B; ++b) sum += load(dout[b * positions + i]);
    addTo(&dwpe[i], sum);
  }
}

// One warp per row.
template <typename D>
__global__ void layernormForwardKernel(D* out, float* mean, float* rstd, const D* inp, const D* weight, const D* bias,
                                       int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const D* x = inp + static_cast<size_t>(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += load(x[c]);
  const float mu = warpSum(sum) / C;
  float squares = 0;
  for (int c = lane; c < C; c += 32) squares += (load(x[c]) - mu) * (load(x[c]) - mu);
  const float r = rsqrtf(warpSum(squares) / C + 1e-5f);
  D* y = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = store<D>((load(x[c]) - mu) * r * load(weight[c]) + load(bias[c]));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = r;
  }
}

// dinp only, one warp per row; the parameter gradients are column sums (below).
template <typename D>
__global__ void layernormBackwardKernel(D* dinp, const D* dout, const D* inp, const D* weight, const float* mean,
                                        const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const D* x = inp + static_cast<size_t>(row) * C;
  const D* dy = dout + static_cast<size_t>(row) * C;
  const float mu = mean[row], r = rstd[row];
  float sumG = 0, sumGXhat = 0;
  for (int c = lane; c < C; c += 32) {
    const float g = load(dy[c]) * load(weight[c]);
    sumG += g;
    sumGXhat += g * (load(x[c]) - mu) * r;
  }
  const float meanG = warpSum(sumG) / C, meanGXhat = warpSum(sumGXhat) / C;
  D* dx = dinp + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (load(x[c]) - mu) * r;
    addTo(&dx[c], r * (load(dy[c]) * load(weight[c]) - meanG - xhat * meanGXhat));
  }
}

constexpr int kChunkRows = 128;

// Partial column sums of dout * xhat and dout over one chunk of kChunkRows rows: block (32 columns, 8 row
// groups), the groups combined in shared memory in order. partial is [chunks, 2, C].
template <typename D>
__global__ void layernormParamPartialKernel(float* partial, const D* dout, const D* inp, const float* mean,
                                            const float* rstd, int N, int C) {
  __shared__ float weights[8][32], biases[8][32];
  const int c = blockIdx.x * 32 + threadIdx.x, chunk = blockIdx.y;
  float sumW = 0, sumB = 0;
  if (c < C) {
    const int last = min(N, (chunk + 1) * kChunkRows);
    for (int row = chunk * kChunkRows + threadIdx.y; row < last; row += 8) {
      const size_t at = static_cast<size_t>(row) * C + c;
      const float dy = load(dout[at]);
      sumW += dy * (load(inp[at]) - mean[row]) * rstd[row];
      sumB += dy;
    }
  }
  weights[threadIdx.y][threadIdx.x] = sumW;
  biases[threadIdx.y][threadIdx.x] = sumB;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int y = 1; y < 8; ++y) {
    sumW += weights[y][threadIdx.x];
    sumB += biases[y][threadIdx.x];
  }
  partial[(static_cast<size_t>(chunk) * 2) * C + c] = sumW;
  partial[(static_cast<size_t>(chunk) * 2 + 1) * C + c] = sumB;
}

// Adds the chunks' partial sums, in chunk order, to dweight and dbias.
template <typename D>
__global__ void layernormParamSumKernel(D* dweight, D* dbias, const float* partial, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sumW = 0, sumB = 0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    sumW += partial[(static_cast<size_t>(chunk) * 2) * C + c];
    sumB += partial[(static_cast<size_t>(chunk) * 2 + 1) * C + c];
  }
  addTo(&dweight[c], sumW);
  addTo(&dbias[c], sumB);
}

// dbias[o] += sum over rows of dout[row, o]: a thread per column, rows in order.
template <typename D>
__global__ void biasGradientKernel(D* dbias, const D* dout, int N, int OC) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float sum = 0;
  for (int i = 0; i < N; ++i) sum += load(dout[static_cast<size_t>(i) * OC + o]);
  addTo(&dbias[o], sum);
}

// Causal softmax of each row t of a T x T block, in place; zero above the diagonal. One warp per row.
template <typename D>
__global__ void causalSoftmaxKernel(D* att, int T, size_t rows) {
  const size_t row = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  D* p = att + row * T;
  float maxScore = -INFINITY;
  for (int s = lane; s <= t; s += 32) maxScore = fmaxf(maxScore, load(p[s]));
  maxScore = warpMax(maxScore);
  float sum = 0;
  for (int s = lane; s <= t; s += 32) sum += expf(load(p[s]) - maxScore);
  const float inverse = 1.0f / warpSum(sum);
  for (int s = lane; s < T; s += 32) p[s] = store<D>(s <= t ? expf(load(p[s]) - maxScore) * inverse : 0.0f);
}

// dS = P * (dP - rowsum(P * dP)) * scale, in place over dP; one warp per row.
template <typename D>
__global__ void softmaxBackwardKernel(D* d, const D* att, int T, float scale, size_t rows) {
  const size_t row = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const D* p = att + row * T;
  D* g = d + row * T;
  float weighted = 0;
  for (int s = lane; s <= t; s += 32) weighted += load(p[s]) * load(g[s]);
  weighted = warpSum(weighted);
  for (int s = lane; s < T; s += 32) g[s] = store<D>(s <= t ? load(p[s]) * (load(g[s]) - weighted) * scale : 0.0f);
}

__device__ float geluTanh(float x) { return tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)); }

template <typename D>
__global__ void geluForwardKernel(D* out, const D* inp, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const float x = load(inp[i]);
    out[i] = store<D>(0.5f * x * (1.0f + geluTanh(x)));
  }
}

template <typename D>
__global__ void geluBackwardKernel(D* dinp, const D* dout, const D* inp, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const float x = load(inp[i]), th = geluTanh(x);
    const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    addTo(&dinp[i], load(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du));
  }
}

template <typename D>
__global__ void residualForwardKernel(D* out, const D* a, const D* b, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = store<D>(load(a[i]) + load(b[i]));
}

template <typename D>
__global__ void residualBackwardKernel(D* da, D* db, const D* dout, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    addTo(&da[i], load(dout[i]));
    addTo(&db[i], load(dout[i]));
  }
}

// out[row, :] = bias, before a GEMM that adds the product (so that bf16 rounds once).
template <typename D>
__global__ void fillBiasKernel(D* out, const D* bias, int OC, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = bias[i % OC];
}

template <typename D>
__global__ void gatherRowsKernel(D* out, const D* inp, const int32_t* rows, const float* scales, int n, int C) {
  const size_t total = static_cast<size_t>(n) * C;
  for (size_t i = firstIndex(); i < total; i += gridStride()) {
    const size_t row = i / C, c = i % C;
    const float factor = scales != nullptr ? scales[row] : 1.0f;
    out[i] = store<D>(factor * load(inp[static_cast<size_t>(rows[row]) * C + c]));
  }
}

template <typename D>
__global__ void combineRowsKernel(D* out, const D* inp, const int32_t* slots, const float* gates, int tokens, int k,
                                  int C) {
  const size_t total = static_cast<size_t>(tokens) * C;
  for (size_t i = firstIndex(); i < total; i += gridStride()) {
    const size_t t = i / C, c = i % C;
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      const int32_t slot = slots[t * k + j];
      if (slot < 0) continue;
      sum += (gates != nullptr ? gates[t * k + j] : 1.0f) * load(inp[static_cast<size_t>(slot) * C + c]);
    }
    out[i] = store<D>(load(out[i]) + sum);
  }
}

template <typename D>
__global__ void rowDotsKernel(float* out, const D* a, const int32_t* rows, const D* b, int n, int C) {
  for (size_t i = firstIndex(); i < static_cast<size_t>(n); i += gridStride()) {
    const D* x = a + static_cast<size_t>(rows[i]) * C;
    const D* y = b + i * C;
    float sum = 0;
    for (int c = 0; c < C; ++c) sum += load(x[c]) * load(y[c]);
    out[i] = sum;
  }
}

// C (m x n) = alpha op(A) op(B) + beta C in cuBLAS's column-major terms, D elements, fp32 accumulation.
template <typename D>
void gemm(cublasHandle_t handle, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k, float alpha,
          const D* a, int lda, const D* b, int ldb, float beta, D* c, int ldc, const char* what) {
  check(cublasGemmEx(handle, opA, opB, m, n, k, &alpha, a, blasType<D>(), lda, b, blasType<D>(), ldb, &beta, c,
                     blasType<D>(), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
}

template <typename D>
void gemmBatched(cublasHandle_t handle, cublasOperation_t opA, cublasOperation_t opB, int m, int n, int k, float alpha,
                 const D* a, int lda, long long strideA, const D* b, int ldb, long long strideB, float beta, D* c,
                 int ldc, long long strideC, int batches, const char* what) {
  check(cublasGemmStridedBatchedEx(handle, opA, opB, m, n, k, &alpha, a, blasType<D>(), lda, strideA, b, blasType<D>(),
                                   ldb, strideB, &beta, c, blasType<D>(), ldc, strideC, batches, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
        what);
}

unsigned warpRowBlocks(size_t rows) {
  constexpr size_t kRowsPerBlock = kThreads / 32;
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

template <typename E>
void embeddingForward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int B, int T, int C, void* stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  embeddingForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(out), tokens, dev(wte), dev(wpe), T, C,
                                                                          n);
}

template <typename E>
void embeddingBackward(E* dwte, E* dwpe, const E* dout, const int32_t* tokens, int B, int T, int C, int V,
                       void* stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  cudaStream_t s = asStream(stream);
  if constexpr (std::is_same_v<E, float>) {
    tokenEmbeddingBackwardKernel<<<blocksFor(n), kThreads, 0, s>>>(dwte, dev(dout), tokens, C, n);
  } else {
    // bf16 would round at every add: the sums go into an fp32 table first, added to the gradient once.
    float* sums = nullptr;
    const size_t table = static_cast<size_t>(V) * C;
    mustAllocate(reinterpret_cast<void**>(&sums), table * sizeof(float), s, "the token embedding's fp32 sums");
    cudaMemsetAsync(sums, 0, table * sizeof(float), s);
    tokenEmbeddingBackwardKernel<<<blocksFor(n), kThreads, 0, s>>>(sums, dev(dout), tokens, C, n);
    addFloatsKernel<<<blocksFor(table), kThreads, 0, s>>>(dev(dwte), sums, table);
    cudaFreeAsync(sums, s);
  }
  positionEmbeddingBackwardKernel<<<blocksFor(static_cast<size_t>(T) * C), kThreads, 0, asStream(stream)>>>(
      dev(dwpe), dev(dout), B, T, C);
}

template <typename E>
void layernormForward(E* out, float* mean, float* rstd, const E* inp, const E* weight, const E* bias, int N, int C,
                      void* stream) {
  layernormForwardKernel<<<warpRowBlocks(N), kThreads, 0, asStream(stream)>>>(dev(out), mean, rstd, dev(inp),
                                                                              dev(weight), dev(bias), N, C);
}

template <typename E>
void layernormBackward(E* dinp, E* dweight, E* dbias, const E* dout, const E* inp, const E* weight, const float* mean,
                       const float* rstd, int N, int C, void* stream) {
  cudaStream_t s = asStream(stream);
  layernormBackwardKernel<<<warpRowBlocks(N), kThreads, 0, s>>>(dev(dinp), dev(dout), dev(inp), dev(weight), mean, rstd,
                                                                N, C);
  const int chunks = (N + kChunkRows - 1) / kChunkRows;
  float* partial = nullptr;
  mustAllocate(reinterpret_cast<void**>(&partial), sizeof(float) * 2 * chunks * C, s, "layernorm's partial sums");
  layernormParamPartialKernel<<<dim3((C + 31) / 32, chunks), dim3(32, 8), 0, s>>>(partial, dev(dout), dev(inp), mean,
                                                                                  rstd, N, C);
  layernormParamSumKernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, s>>>(dev(dweight), dev(dbias), partial, chunks,
                                                                             C);
  cudaFreeAsync(partial, s);
}

// Row-major X[rows, cols] is column-major X^T: out = inp x W^T is out^T = W x inp^T in cuBLAS's terms.
template <typename E>
void matmulForward(E* out, const E* inp, const E* weight, std::type_identity_t<const E*> bias, int N, int C, int OC,
                   void* stream) {
  // With a bias, out starts as the bias and the GEMM adds to it: one rounding in bf16.
  if (bias != nullptr) {
    const size_t n = static_cast<size_t>(N) * OC;
    fillBiasKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(out), dev(bias), OC, n);
  }
  gemm(blas(stream), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, 1.0f, dev(weight), C, dev(inp), C,
       bias != nullptr ? 1.0f : 0.0f, dev(out), OC, "matmul forward");
}

template <typename E>
void matmulBackward(E* dinp, E* dweight, std::type_identity_t<E*> dbias, const E* dout, const E* inp, const E* weight,
                    int N, int C, int OC, void* stream) {
  cublasHandle_t handle = blas(stream);
  if (dinp != nullptr)
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, 1.0f, dev(weight), C, dev(dout), OC, 1.0f, dev(dinp), C,
         "matmul backward (input)");
  if (dweight != nullptr)
    gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, 1.0f, dev(inp), C, dev(dout), OC, 1.0f, dev(dweight), C,
         "matmul backward (weight)");
  if (dbias != nullptr)
    biasGradientKernel<<<(OC + kThreads - 1) / kThreads, kThreads, 0, asStream(stream)>>>(dev(dbias), dev(dout), N, OC);
}

// Per sequence b, over its NH heads at once (strided-batched, head h's columns hs apart): S = scale Q K^T into att,
// the causal softmax, then Y = P V.
template <typename E>
void attentionForward(E* out, E* att, const E* inp, int B, int T, int C, int NH, void* stream) {
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const long long block = static_cast<long long>(T) * T;
  cublasHandle_t handle = blas(stream);
  for (int b = 0; b < B; ++b) {
    const Dev<E>* q = dev(inp) + static_cast<size_t>(b) * T * ld;
    Dev<E>* s = dev(att) + static_cast<size_t>(b) * NH * block;
    gemmBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, q + C, ld, hs, q, ld, hs, 0.0f, s, T, block, NH,
                "attention scores");
  }
  const size_t rows = static_cast<size_t>(B) * NH * T;
  causalSoftmaxKernel<<<warpRowBlocks(rows), kThreads, 0, asStream(stream)>>>(dev(att), T, rows);
  for (int b = 0; b < B; ++b) {
    const Dev<E>* v = dev(inp) + static_cast<size_t>(b) * T * ld + 2 * C;
    const Dev<E>* p = dev(att) + static_cast<size_t>(b) * NH * block;
    Dev<E>* y = dev(out) + static_cast<size_t>(b) * T * C;
    gemmBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, ld, hs, p, T, block, 0.0f, y, C, hs, NH,
                "attention output");
  }
}

// dP = dY V^T, dS = softmax backward (in scratch), dQ += dS K, dK += dS^T Q, dV += P^T dY.
template <typename E>
void attentionBackward(E* dinp, const E* dout, const E* inp, const E* att, E* scratch, int B, int T, int C, int NH,
                       void* stream) {
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const long long block = static_cast<long long>(T) * T;
  cublasHandle_t handle = blas(stream);
  for (int b = 0; b < B; ++b) {
    const Dev<E>* v = dev(inp) + static_cast<size_t>(b) * T * ld + 2 * C;
    const Dev<E>* dy = dev(dout) + static_cast<size_t>(b) * T * C;
    Dev<E>* d = dev(scratch) + static_cast<size_t>(b) * NH * block;
    gemmBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, ld, hs, dy, C, hs, 0.0f, d, T, block, NH,
                "attention backward (dP)");
  }
  const size_t rows = static_cast<size_t>(B) * NH * T;
  softmaxBackwardKernel<<<warpRowBlocks(rows), kThreads, 0, asStream(stream)>>>(dev(scratch), dev(att), T, scale, rows);
  for (int b = 0; b < B; ++b) {
    const size_t first = static_cast<size_t>(b) * T * ld;
    const Dev<E>* q = dev(inp) + first;
    const Dev<E>* k = q + C;
    const Dev<E>* p = dev(att) + static_cast<size_t>(b) * NH * block;
    const Dev<E>* ds = dev(scratch) + static_cast<size_t>(b) * NH * block;
    const Dev<E>* dy = dev(dout) + static_cast<size_t>(b) * T * C;
    Dev<E>* dq = dev(dinp) + first;
    gemmBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, k, ld, hs, ds, T, block, 1.0f, dq, ld, hs, NH,
                "attention backward (dQ)");
    gemmBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, ld, hs, ds, T, block, 1.0f, dq + C, ld, hs, NH,
                "attention backward (dK)");
    gemmBatched(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dy, C, hs, p, T, block, 1.0f, dq + 2 * C, ld, hs, NH,
                "attention backward (dV)");
  }
}

template <typename E>
void geluForward(E* out, const E* inp, size_t n, void* stream) {
  geluForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(out), dev(inp), n);
}
template <typename E>
void geluBackward(E* dinp, const E* dout, const E* inp, size_t n, void* stream) {
  geluBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(dinp), dev(dout), dev(inp), n);
}
template <typename E>
void residualForward(E* out, const E* a, const E* b, size_t n, void* stream) {
  residualForwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(out), dev(a), dev(b), n);
}
template <typename E>
void residualBackward(E* da, E* db, const E* dout, size_t n, void* stream) {
  residualBackwardKernel<<<blocksFor(n), kThreads, 0, asStream(stream)>>>(dev(da), dev(db), dev(dout), n);
}

template <typename E>
void gatherRows(E* out, const E* inp, const int32_t* rows, const float* scales, int n, int C, void* stream) {
  if (n == 0) return;
  gatherRowsKernel<<<blocksFor(static_cast<size_t>(n) * C), kThreads, 0, asStream(stream)>>>(dev(out), dev(inp), rows,
                                                                                             scales, n, C);
}
template <typename E>
void combineRows(E* out, const E* inp, const int32_t* slots, const float* gates, int tokens, int k, int C,
                 void* stream) {
  if (tokens == 0) return;
  combineRowsKernel<<<blocksFor(static_cast<size_t>(tokens) * C), kThreads, 0, asStream(stream)>>>(
      dev(out), dev(inp), slots, gates, tokens, k, C);
}
template <typename E>
void rowDots(float* out, const E* a, const int32_t* rows, const E* b, int n, int C, void* stream) {
  if (n == 0) return;
  rowDotsKernel<<<blocksFor(static_cast<size_t>(n)), kThreads, 0, asStream(stream)>>>(out, dev(a), rows, dev(b), n, C);
}

bool launchFailed(const char** message) {
  const cudaError_t error = cudaGetLastError();
  *message = error == cudaSuccess ? "" : cudaGetErrorString(error);
  return error != cudaSuccess;
}

// The two element types of kernels.h.
#define LOOM_INSTANTIATE(E)                                                                                       \
  template void embeddingForward(E*, const int32_t*, const E*, const E*, int, int, int, void*);                   \
  template void embeddingBackward(E*, E*, const E*, const int32_t*, int, int, int, int, void*);                   \
  template void layernormForward(E*, float*, float*, const E*, const E*, const E*, int, int, void*);              \
  template void layernormBackward(E*, E*, E*, const E*, const E*, const E*, const float*, const float*, int, int, \
                                  void*);                                                                         \
  template void matmulForward<E>(E*, const E*, const E*, const E*, int, int, int, void*);                         \
  template void matmulBackward<E>(E*, E*, E*, const E*, const E*, const E*, int, int, int, void*);                \
  template void attentionForward(E*, E*, const E*, int, int, int, int, void*);                                    \
  template void attentionBackward(E*, const E*, const E*, const E*, E*, int, int, int, int, void*);               \
  template void geluForward(E*, const E*, size_t, void*);                                                         \
  template void geluBackward(E*, const E*, const E*, size_t, void*);                                              \
  template void residualForward(E*, const E*, const E*, size_t, void*);                                           \
  template void residualBackward(E*, E*, const E*, size_t, void*);                                                \
  template void gatherRows(E*, const E*, const int32_t*, const float*, int, int, void*);                          \
  template void combineRows(E*, const E*, const int32_t*, const float*, int, int, int, void*);                    \
  template void rowDots(float*, const E*, const int32_t*, const E*, int, int, void*);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(Bf16)
#undef LOOM_INSTANTIATE

}  // namespace loom::parallel::cuda
