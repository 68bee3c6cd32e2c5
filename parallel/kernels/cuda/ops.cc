// The CUDA device's Ops (ops.h).
#include "parallel/kernels/cuda/ops.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "parallel/bf16.h"
#include "parallel/kernels/cuda/kernels.h"

namespace loom::parallel::cuda {
namespace {

// A CUDA call that must not fail: the training step cannot go on without it.
void must(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "parallel/cuda: %s failed: %s\n", what, cudaGetErrorString(error));
  std::exit(1);
}

// E: float or Bf16, the element type of parameters, gradients and activations.
template <typename E>
class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device) : device_(device) {
    must(cudaSetDevice(device), "cudaSetDevice");
    must(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (compute)");
    must(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming), "cudaEventCreate");
    sum_ = static_cast<double*>(allocate(sizeof(double)));
  }
  ~CudaOps() override {
    deallocate(sum_);
    if (scratch_ != nullptr) deallocate(scratch_);
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(computed_);
    cudaStreamDestroy(stream_);
  }

  std::string describe() const override {
    return "cuda:" + std::to_string(device_) + (std::is_same_v<E, float> ? " fp32" : " bf16");
  }
  DType dtype() const override { return std::is_same_v<E, float> ? DType::kFloat32 : DType::kBfloat16; }
  bool onDevice() const override { return true; }

  void* allocate(size_t bytes) override {
    void* memory = nullptr;
    const cudaError_t error = cudaMallocAsync(&memory, bytes, stream_);
    if (error != cudaSuccess) {
      std::fprintf(stderr, "parallel/cuda: out of device memory on device %d allocating %zu bytes: %s\n", device_,
                   bytes, cudaGetErrorString(error));
      std::exit(1);
    }
    must(cudaMemsetAsync(memory, 0, bytes, stream_), "cudaMemsetAsync");
    return memory;
  }
  void deallocate(void* memory) override { cudaFreeAsync(memory, stream_); }
  void zero(void* memory, size_t bytes) override {
    must(cudaMemsetAsync(memory, 0, bytes, stream_), "cudaMemsetAsync");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    must(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (device)");
  }
  void upload(void* dst, const void* hostSrc, size_t bytes) override {
    must(cudaMemcpyAsync(dst, hostSrc, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
    must(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload)");
  }
  void download(void* hostDst, const void* src, size_t bytes) override {
    must(cudaMemcpyAsync(hostDst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (download)");
    must(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
  }
  void uploadFloats(void* dst, const float* hostSrc, size_t n) override {
    if constexpr (std::is_same_v<E, float>) {
      upload(dst, hostSrc, n * sizeof(float));
    } else {
      std::vector<Bf16> rounded(n);
      for (size_t i = 0; i < n; ++i) rounded[i] = toBf16(hostSrc[i]);
      upload(dst, rounded.data(), n * sizeof(Bf16));
    }
  }
  void downloadFloats(float* hostDst, const void* src, size_t n) override {
    if constexpr (std::is_same_v<E, float>) {
      download(hostDst, src, n * sizeof(float));
    } else {
      std::vector<Bf16> values(n);
      download(values.data(), src, n * sizeof(Bf16));
      for (size_t i = 0; i < n; ++i) hostDst[i] = fromBf16(values[i]);
    }
  }

  loomStream_t createStream() override {
    cudaStream_t stream = nullptr;
    must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (communication)");
    return stream;
  }
  void destroyStream(loomStream_t stream) override { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
  void commAfterCompute(loomStream_t stream) override {
    must(cudaEventRecord(computed_, stream_), "cudaEventRecord");
    must(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), computed_, 0), "cudaStreamWaitEvent");
  }
  loomResult_t synchronize(loomStream_t stream, loomComm_t comm) override {
    const cudaError_t error = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    if (error != cudaSuccess) {
      std::fprintf(stderr, "parallel/cuda: a communication stream failed: %s\n", cudaGetErrorString(error));
      return loomUnhandledCudaError;
    }
    loomResult_t asyncError = loomSuccess;
    const loomResult_t result = loomCommGetAsyncError(comm, &asyncError);
    if (result != loomSuccess) return result;
    return asyncError == loomInProgress ? loomSuccess : asyncError;
  }

  void embeddingForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                        int C) override {
    cuda::embeddingForward(e(out), tokens, e(wte), e(wpe), B, T, C, stream_);
    launched("embedding forward");
  }
  void embeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                         int V) override {
    cuda::embeddingBackward(e(dwte), e(dwpe), e(dout), tokens, B, T, C, V, stream_);
    launched("embedding backward");
  }
  void layernormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                        int N, int C) override {
    cuda::layernormForward(e(out), mean, rstd, e(inp), e(weight), e(bias), N, C, stream_);
    launched("layernorm forward");
  }
  void layernormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         const float* mean, const float* rstd, int N, int C) override {
    cuda::layernormBackward(e(dinp), e(dweight), e(dbias), e(dout), e(inp), e(weight), mean, rstd, N, C, stream_);
    launched("layernorm backward");
  }
  void matmulForward(void* out, const void* inp, const void* weight, const void* bias, int N, int C, int OC) override {
    cuda::matmulForward(e(out), e(inp), e(weight), e(bias), N, C, OC, stream_);
    launched("matmul forward");
  }
  void matmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                      int N, int C, int OC) override {
    cuda::matmulBackward(e(dinp), e(dweight), e(dbias), e(dout), e(inp), e(weight), N, C, OC, stream_);
    launched("matmul backward");
  }
  void attentionForward(void* out, void* att, const void* inp, int B, int T, int C, int NH) override {
    cuda::attentionForward(e(out), e(att), e(inp), B, T, C, NH, stream_);
    launched("attention forward");
  }
  void attentionBackward(void* dinp, const void* dout, const void* inp, const void* att, int B, int T, int C,
                         int NH) override {
    const size_t bytes = static_cast<size_t>(B) * NH * T * T * sizeof(E);
    if (bytes > scratchBytes_) {
      if (scratch_ != nullptr) deallocate(scratch_);
      scratch_ = allocate(bytes);
      scratchBytes_ = bytes;
    }
    cuda::attentionBackward(e(dinp), e(dout), e(inp), e(att), e(scratch_), B, T, C, NH, stream_);
    launched("attention backward");
  }
  void geluForward(void* out, const void* inp, size_t n) override {
    cuda::geluForward(e(out), e(inp), n, stream_);
    launched("gelu forward");
  }
  void geluBackward(void* dinp, const void* dout, const void* inp, size_t n) override {
    cuda::geluBackward(e(dinp), e(dout), e(inp), n, stream_);
    launched("gelu backward");
  }
  void residualForward(void* out, const void* a, const void* b, size_t n) override {
    cuda::residualForward(e(out), e(a), e(b), n, stream_);
    launched("residual forward");
  }
  void residualBackward(void* da, void* db, const void* dout, size_t n) override {
    cuda::residualBackward(e(da), e(db), e(dout), n, stream_);
    launched("residual backward");
  }
  void crossEntropyForward(float* losses, void* probs, const void* logits, const int32_t* targets, int N,
                           int V) override {
    cuda::crossEntropyForward(losses, e(probs), e(logits), targets, N, V, stream_);
    launched("cross-entropy forward");
  }
  void crossEntropyBackward(void* dlogits, const float* dlosses, const void* probs, const int32_t* targets, int N,
                            int V) override {
    cuda::crossEntropyBackward(e(dlogits), dlosses, e(probs), targets, N, V, stream_);
    launched("cross-entropy backward");
  }
  void crossEntropyMax(float* maxes, const void* logits, int N, int V) override {
    cuda::crossEntropyMax(maxes, e(logits), N, V, stream_);
    launched("cross-entropy maximum");
  }
  void crossEntropyExp(float* sums, float* targetLogits, void* probs, const void* logits, const float* maxes,
                       const int32_t* targets, int N, int V) override {
    cuda::crossEntropyExp(sums, targetLogits, e(probs), e(logits), maxes, targets, N, V, stream_);
    launched("cross-entropy exponentials");
  }
  void crossEntropyFinish(float* losses, void* probs, const float* sums, const float* targetLogits, int N,
                          int V) override {
    cuda::crossEntropyFinish(losses, e(probs), sums, targetLogits, N, V, stream_);
    launched("cross-entropy finish");
  }
  void gatherRows(void* out, const void* inp, const int32_t* rows, const float* scales, int n, int C) override {
    cuda::gatherRows(e(out), e(inp), rows, scales, n, C, stream_);
    launched("gather rows");
  }
  void combineRows(void* out, const void* inp, const int32_t* slots, const float* gates, int tokens, int k,
                   int C) override {
    cuda::combineRows(e(out), e(inp), slots, gates, tokens, k, C, stream_);
    launched("combine rows");
  }
  void rowDots(float* out, const void* a, const int32_t* rows, const void* b, int n, int C) override {
    cuda::rowDots(out, e(a), rows, e(b), n, C, stream_);
    launched("row dots");
  }
  double sumOfSquares(const void* values, size_t n) override {
    zero(sum_, sizeof(double));
    cuda::sumOfSquares(sum_, e(values), n, stream_);
    launched("sum of squares");
    double sum = 0;
    download(&sum, sum_, sizeof(sum));
    return sum;
  }
  void adamw(void* params, const void* grads, float* master, float* m, float* v, size_t n,
             const AdamWStep& s) override {
    if constexpr (std::is_same_v<E, float>) {
      if (master != nullptr) {
        std::fprintf(stderr, "parallel/cuda: fp32 parameters have no master weights\n");
        std::exit(1);
      }
      cuda::adamwUpdate(e(params), e(grads), m, v, n, s.learningRate, s.beta1, s.beta2, s.eps, s.weightDecay, s.step,
                        s.gradScale, stream_);
    } else {
      if (master == nullptr) {
        std::fprintf(stderr, "parallel/cuda: bf16 parameters need fp32 master weights\n");
        std::exit(1);
      }
      cuda::adamwUpdate(e(params), e(grads), master, m, v, n, s.learningRate, s.beta1, s.beta2, s.eps, s.weightDecay,
                        s.step, s.gradScale, stream_);
    }
    launched("adamw");
  }

 private:
  static E* e(void* p) { return static_cast<E*>(p); }
  static const E* e(const void* p) { return static_cast<const E*>(p); }
  // A kernel that could not start (a bad configuration, no device) ends the program with the reason.
  void launched(const char* what) {
    const char* message = "";
    if (!launchFailed(&message)) return;
    std::fprintf(stderr, "parallel/cuda: %s did not launch on device %d: %s\n", what, device_, message);
    std::exit(1);
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  double* sum_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratchBytes_ = 0;
};

}  // namespace

int deviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::unique_ptr<Ops> makeOps(int device, DType dtype, std::string* error) {
  const int devices = deviceCount();
  if (device < 0 || device >= devices) {
    *error = "no CUDA device " + std::to_string(device) + " (this process sees " + std::to_string(devices) + ")";
    return nullptr;
  }
  if (dtype == DType::kFloat32) return std::make_unique<CudaOps<float>>(device);
  if (dtype == DType::kBfloat16) return std::make_unique<CudaOps<Bf16>>(device);
  *error = std::string("the CUDA kernels take fp32 or bf16, not ") + dtypeName(dtype);
  return nullptr;
}

}  // namespace loom::parallel::cuda
