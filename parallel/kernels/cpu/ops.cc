// The CPU's Ops (kernels/ops.h): host memory, loom host streams, the fp32 kernels of kernels.h.
#include "parallel/kernels/ops.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "parallel/kernels/cpu/kernels.h"

namespace loom::parallel {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }

class CpuOps final : public Ops {
 public:
  std::string describe() const override { return "cpu fp32"; }
  DType dtype() const override { return DType::kFloat32; }
  bool onDevice() const override { return false; }

  void* allocate(size_t bytes) override {
    void* memory = ::operator new (bytes, std::align_val_t{64}, std::nothrow);
    if (memory == nullptr) {
      std::fprintf(stderr, "parallel: out of host memory allocating %zu bytes\n", bytes);
      std::exit(1);
    }
    std::memset(memory, 0, bytes);
    return memory;
  }
  void deallocate(void* memory) override { ::operator delete (memory, std::align_val_t{64}); }
  void zero(void* memory, size_t bytes) override { std::memset(memory, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void upload(void* dst, const void* hostSrc, size_t bytes) override { std::memmove(dst, hostSrc, bytes); }
  void download(void* hostDst, const void* src, size_t bytes) override { std::memmove(hostDst, src, bytes); }
  void uploadFloats(void* dst, const float* hostSrc, size_t n) override { upload(dst, hostSrc, n * sizeof(float)); }
  void downloadFloats(float* hostDst, const void* src, size_t n) override { download(hostDst, src, n * sizeof(float)); }

  loomStream_t createStream() override {
    loomStream_t stream = nullptr;
    if (loomStreamCreate(&stream) != loomSuccess) {
      std::fprintf(stderr, "parallel: loomStreamCreate failed: %s\n", loomGetLastError(nullptr));
      std::exit(1);
    }
    return stream;
  }
  void destroyStream(loomStream_t stream) override { loomStreamDestroy(stream); }
  void commAfterCompute(loomStream_t) override {}  // the computation is done when its call returns
  loomResult_t synchronize(loomStream_t stream, loomComm_t) override { return loomStreamSynchronize(stream); }

  void embeddingForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                        int C) override {
    cpu::embeddingForward(f(out), tokens, f(wte), f(wpe), B, T, C);
  }
  void embeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                         int V) override {
    cpu::embeddingBackward(f(dwte), f(dwpe), f(dout), tokens, B, T, C, V);
  }
  void layernormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight, const void* bias,
                        int N, int C) override {
    cpu::layernormForward(f(out), mean, rstd, f(inp), f(weight), f(bias), N, C);
  }
  void layernormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                         const float* mean, const float* rstd, int N, int C) override {
    cpu::layernormBackward(f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), mean, rstd, N, C);
  }
  void matmulForward(void* out, const void* inp, const void* weight, const void* bias, int N, int C, int OC) override {
    cpu::matmulForward(f(out), f(inp), f(weight), f(bias), N, C, OC);
  }
  void matmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* weight,
                      int N, int C, int OC) override {
    cpu::matmulBackward(f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), N, C, OC);
  }
  void attentionForward(void* out, void* att, const void* inp, int B, int T, int C, int NH) override {
    cpu::attentionForward(f(out), f(att), f(inp), B, T, C, NH);
  }
  void attentionBackward(void* dinp, const void* dout, const void* inp, const void* att, int B, int T, int C,
                         int NH) override {
    cpu::attentionBackward(f(dinp), f(dout), f(inp), f(att), B, T, C, NH);
  }
  void geluForward(void* out, const void* inp, size_t n) override { cpu::geluForward(f(out), f(inp), n); }
  void geluBackward(void* dinp, const void* dout, const void* inp, size_t n) override {
    cpu::geluBackward(f(dinp), f(dout), f(inp), n);
  }
  void residualForward(void* out, const void* a, const void* b, size_t n) override {
    cpu::residualForward(f(out), f(a), f(b), n);
  }
  void residualBackward(void* da, void* db, const void* dout, size_t n) override {
    cpu::residualBackward(f(da), f(db), f(dout), n);
  }
  void crossEntropyForward(float* losses, void* probs, const void* logits, const int32_t* targets, int N,
                           int V) override {
    cpu::crossEntropyForward(losses, f(probs), f(logits), targets, N, V);
  }
  void crossEntropyBackward(void* dlogits, const float* dlosses, const void* probs, const int32_t* targets, int N,
                            int V) override {
    cpu::crossEntropyBackward(f(dlogits), dlosses, f(probs), targets, N, V);
  }
  double sumOfSquares(const void* values, size_t n) override { return cpu::sumOfSquares(f(values), n); }
  void gatherRows(void* out, const void* inp, const int32_t* rows, const float* scales, int n, int C) override {
    cpu::gatherRows(f(out), f(inp), rows, scales, n, C);
  }
  void combineRows(void* out, const void* inp, const int32_t* slots, const float* gates, int tokens, int k,
                   int C) override {
    cpu::combineRows(f(out), f(inp), slots, gates, tokens, k, C);
  }
  void rowDots(float* out, const void* a, const int32_t* rows, const void* b, int n, int C) override {
    cpu::rowDots(out, f(a), rows, f(b), n, C);
  }
  void crossEntropyMax(float* maxes, const void* logits, int N, int V) override {
    cpu::crossEntropyMax(maxes, f(logits), N, V);
  }
  void crossEntropyExp(float* sums, float* targetLogits, void* probs, const void* logits, const float* maxes,
                       const int32_t* targets, int N, int V) override {
    cpu::crossEntropyExp(sums, targetLogits, f(probs), f(logits), maxes, targets, N, V);
  }
  void crossEntropyFinish(float* losses, void* probs, const float* sums, const float* targetLogits, int N,
                          int V) override {
    cpu::crossEntropyFinish(losses, f(probs), sums, targetLogits, N, V);
  }
  void adamw(void* params, const void* grads, float* master, float* m, float* v, size_t n,
             const AdamWStep& s) override {
    if (master != nullptr) {
      std::fprintf(stderr, "parallel: the CPU keeps fp32 parameters, without master weights\n");
      std::exit(1);
    }
    cpu::adamwUpdate(f(params), f(grads), m, v, n, s.learningRate, s.beta1, s.beta2, s.eps, s.weightDecay, s.step,
                     s.gradScale);
  }
};

}  // namespace

Ops& cpuOps() {
  static CpuOps ops;
  return ops;
}

loomDataType_t loomTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return loomFloat32;
    case DType::kBfloat16:
      return loomBfloat16;
    case DType::kInt32:
      return loomInt32;
  }
  return loomFloat32;
}

}  // namespace loom::parallel
