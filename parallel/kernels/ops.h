// Where the model's tensors live and how its kernels run there: the CPU in fp32 (cpuOps()), or a CUDA device in fp32
// or bf16 (parallel/kernels/cuda/ops.h). The model and the strategies are written once against this interface.
//
// One element type (dtype()) serves parameters, gradients and activations; layernorm's statistics, the losses and
// AdamW's moments and master weights are fp32 whatever it is. Pointers typed void* below hold dtype() elements and
// live in the Ops' memory; float* ones are fp32 in the same memory.
//
// Order: kernels and copies run in the order they are called, on the Ops' compute stream (on the CPU: at once, on
// the calling thread). An Ops is used from one thread at a time, and a CUDA one from threads whose current device
// is its own (it sets it when made). Communication runs on streams of its own (stream()); a strategy orders it after
// the computation with commAfterCompute() and waits for it with synchronize(). Functions that return values to the host
// (download, sumOfSquares) wait for the computation before them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/loom.h"
#include "parallel/tensor.h"

namespace loom::parallel {

// One AdamW step's constants (torch.optim.AdamW's), for Ops::adamw.
struct AdamWStep {
  float learningRate, beta1, beta2, eps, weightDecay;
  int step;         // counts from 1
  float gradScale;  // the clipping factor every gradient is multiplied by first
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string describe() const = 0;  // "cpu fp32", "cuda:0 bf16"
  virtual DType dtype() const = 0;
  size_t elementBytes() const { return dtypeBytes(dtype()); }
  // Whether memory is a CUDA device's (a loom communicator over it must be a CUDA one).
  virtual bool onDevice() const = 0;

  // Memory. allocate() returns zeroed bytes (never null; ends the program with a message when there is no memory);
  // deallocate() frees them once the computation queued before it is done with them.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* memory) = 0;
  virtual void zero(void* memory, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Between the host and this memory; both return when the copy is done.
  virtual void upload(void* dst, const void* hostSrc, size_t bytes) = 0;
  virtual void download(void* hostDst, const void* src, size_t bytes) = 0;
  // n host floats into n dtype() elements (rounded to nearest even for bf16), and back (exact).
  virtual void uploadFloats(void* dst, const float* hostSrc, size_t n) = 0;
  virtual void downloadFloats(float* hostDst, const void* src, size_t n) = 0;

  // Communication streams: for a loom communicator of this memory's kind (a host stream from loomStreamCreate, or a
  // cudaStream_t).
  virtual loomStream_t createStream() = 0;
  virtual void destroyStream(loomStream_t stream) = 0;
  // Work queued on `stream` from now on starts after the computation queued so far.
  virtual void commAfterCompute(loomStream_t stream) = 0;
  // Returns when everything queued on `stream` is done: loomSuccess, or the error of an operation of `comm` that
  // failed (a CUDA communicator records it apart from the stream, which it releases anyway).
  virtual loomResult_t synchronize(loomStream_t stream, loomComm_t comm) = 0;

  // The kernels of parallel/kernels/cpu/kernels.h, in dtype() elements.
  virtual void embeddingForward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                                int C) = 0;
  virtual void embeddingBackward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T, int C,
                                 int V) = 0;
  virtual void layernormForward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                                const void* bias, int N, int C) = 0;
  virtual void layernormBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                                 const void* weight, const float* mean, const float* rstd, int N, int C) = 0;
  virtual void matmulForward(void* out, const void* inp, const void* weight, const void* bias, int N, int C,
                             int OC) = 0;
  // Adds the input's gradient to dinp and the weight's (and bias's) to dweight (dbias); a null dinp or dweight skips
  // that half (ZB-H1's B and W), a null dbias the bias.
  virtual void matmulBackward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp,
                              const void* weight, int N, int C, int OC) = 0;
  virtual void attentionForward(void* out, void* att, const void* inp, int B, int T, int C, int NH) = 0;
  virtual void attentionBackward(void* dinp, const void* dout, const void* inp, const void* att, int B, int T, int C,
                                 int NH) = 0;
  virtual void geluForward(void* out, const void* inp, size_t n) = 0;
  virtual void geluBackward(void* dinp, const void* dout, const void* inp, size_t n) = 0;
  virtual void residualForward(void* out, const void* a, const void* b, size_t n) = 0;
  virtual void residualBackward(void* da, void* db, const void* dout, size_t n) = 0;
  virtual void crossEntropyForward(float* losses, void* probs, const void* logits, const int32_t* targets, int N,
                                   int V) = 0;
  virtual void crossEntropyBackward(void* dlogits, const float* dlosses, const void* probs, const int32_t* targets,
                                    int N, int V) = 0;
  // The sum of squares of n elements, returned to the host.
  virtual double sumOfSquares(const void* values, size_t n) = 0;
  // The vocabulary-parallel cross-entropy's steps (parallel/kernels/cpu/kernels.h); maxes, sums and targetLogits
  // are fp32 [N].
  virtual void crossEntropyMax(float* maxes, const void* logits, int N, int V) = 0;
  virtual void crossEntropyExp(float* sums, float* targetLogits, void* probs, const void* logits, const float* maxes,
                               const int32_t* targets, int N, int V) = 0;
  virtual void crossEntropyFinish(float* losses, void* probs, const float* sums, const float* targetLogits, int N,
                                  int V) = 0;
  // The mixture-of-experts layer's row movements (parallel/kernels/cpu/kernels.h); rows, slots, scales and gates
  // are int32 and fp32 arrays in this Ops' memory, rowDots' out fp32.
  virtual void gatherRows(void* out, const void* inp, const int32_t* rows, const float* scales, int n, int C) = 0;
  virtual void combineRows(void* out, const void* inp, const int32_t* slots, const float* gates, int tokens, int k,
                           int C) = 0;
  virtual void rowDots(float* out, const void* a, const int32_t* rows, const void* b, int n, int C) = 0;
  // dst[i] += src[i].
  void add(void* dst, const void* src, size_t n) { residualForward(dst, dst, src, n); }
  // One AdamW step on n parameters, each gradient scaled by step.gradScale first (in fp32). master null: the
  // parameters are fp32 and are what it updates. Otherwise it updates the fp32 master weights and stores them,
  // rounded, into the dtype() parameters.
  virtual void adamw(void* params, const void* grads, float* master, float* m, float* v, size_t n,
                     const AdamWStep& step) = 0;
};

// The CPU's fp32 kernels (parallel/kernels/cpu), one thread.
Ops& cpuOps();

// The loom element type of dtype() elements.
loomDataType_t loomTypeOf(DType dtype);

// p advanced by `elements` elements of `ops`' dtype.
inline void* elementAt(const Ops& ops, void* p, size_t elements) {
  return static_cast<std::byte*>(p) + elements * ops.elementBytes();
}
inline const void* elementAt(const Ops& ops, const void* p, size_t elements) {
  return static_cast<const std::byte*>(p) + elements * ops.elementBytes();
}

}  // namespace loom::parallel
