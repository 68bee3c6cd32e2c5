// The reference GPT (GPT-2's architecture): token and position embeddings, L pre-norm blocks of causal multi-head
// attention and a 4x GELU MLP, each added to the residual stream, a final layernorm and an output head tied to the
// token embedding. Explicit forward and backward on the kernels of an Ops (parallel/kernels/ops.h): the CPU's in
// fp32, or a CUDA device's in fp32 or bf16, parameters, gradients and activations all in the Ops' element type.
//
// Parameters live in one flat buffer, layer by layer (the embeddings, then each block's tensors, then the final
// layernorm), so that a layer is one contiguous range, a unit: what ZeRO-3 gathers and frees, and the order in
// which backward finishes gradients. Gradients share that layout. A strategy may hand the model each unit's
// parameters and gradients from memory of its own (bindUnit), and is told before and after each unit's use
// (UnitHooks). No dropout (the reference trains without it).
//
// Tensor parallelism (Megatron's): given a communicator of t ranks, each holds its part of the model
// (GptLayout::of(config, t)): its heads of every attention (QKV column-parallel, the output projection
// row-parallel), its quarter of each MLP (the first linear layer column-parallel, the second row-parallel), and its
// rows of the vocabulary (the token embedding and the tied head). The conjugate operators f and g: before each
// column-parallel layer f is the identity forward and an all-reduce of the input's gradient backward; after each
// row-parallel layer g is an all-reduce forward and the identity backward. The embedding's lookups are all-reduced,
// and the cross-entropy over the vocabulary's parts takes three all-reduces (the maximum, the sum of
// exponentials, the target's logit). Layernorms, position embeddings and the row-parallel layers' biases are
// whole on every rank, and so are their gradients.
//
// Sequence parallelism (Korthikanti et al.), with tensor parallelism: outside the tensor-parallel regions (the
// embeddings' output, layernorms, residual sums) each rank holds only its 1/t of the B x T positions (rows), so
// those activations take 1/t of the memory. An all-gather of the rows replaces f before each column-parallel layer
// (and again in backward, to recompute rather than keep the gathered input) and a reduce-scatter replaces g's
// all-reduce after each row-parallel one; backward runs their duals (a reduce-scatter of the input's gradient, an
// all-gather of the output's). Layernorm gradients, summed over a rank's rows only, are all-reduced across the
// ranks before their unit is released (in the model's element type: in bf16 that rounds twice, where a layernorm
// without sequence parallelism rounds once). B x T must be a multiple of t.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/kernels/ops.h"
#include "parallel/scalars.h"
#include "parallel/tensor.h"

namespace loom::parallel {

struct GptConfig {
  int layers = 2;
  int heads = 4;
  int channels = 128;
  int maxT = 64;  // the longest sequence (rows of the position embedding)
  int vocab = 256;

  // "gpt-tiny" (L=2, H=4, C=128, T=64, V=256) or "gpt2-124m" (L=12, H=12, C=768, T=1024, V=50257); false for any
  // other name.
  static bool preset(const std::string& name, GptConfig* out);
  // Empty, or what is wrong ("channels 100 is not divisible by heads 3").
  std::string check() const;
};

// How a parameter is cut over tensor-parallel ranks (Megatron's): whole on every rank; by rows (a column-parallel
// linear layer's output features, the vocabulary of the token embedding), in `parts` blocks each cut separately
// (QKV: q, k and v each give every rank its heads); or by columns (a row-parallel layer's input features).
enum class TensorSplit { kReplicated, kRows, kColumns };

// A named range of the flat parameter buffer.
struct ParamRange {
  std::string name;            // "h.0.attn.qkv.weight", in PyTorch's naming of the same model
  size_t offset;               // elements from the buffer's start
  std::vector<int64_t> shape;  // this rank's part
  TensorSplit split = TensorSplit::kReplicated;
  int parts = 1;
  size_t numel() const;
};

// Where every parameter lies, and where each layer's range starts.
struct GptLayout {
  std::vector<ParamRange> params;
  size_t total = 0;
  // Elements [layerBegin[u], layerBegin[u + 1]) form unit u: 0 the embeddings, 1..L the blocks, L+1 the final
  // layernorm.
  std::vector<size_t> unitBegin;
  int tensorParallel = 1;
  // The layout of one rank's part of the model when it is cut over `tensorParallel` ranks (1: the whole model).
  static GptLayout of(const GptConfig& config, int tensorParallel = 1);
  // Rank `rank`'s part of parameters in the whole model's layout (`full`, tensorParallel 1), and back: unshard
  // writes this rank's elements into the whole buffer.
  void shard(const GptLayout& full, const float* fullValues, int rank, float* local) const;
  void unshard(const GptLayout& full, const float* local, int rank, float* fullValues) const;
};

// Called around every use of a unit: acquire before the model reads its parameters (and, in backward, adds to its
// gradients), release after its last use in the pass (in backward: its gradients are final). Forward acquires the
// embeddings (unit 0), each block in turn, then the final layernorm; it releases each block after it, and the final
// layernorm and the embeddings (which the tied head reads last) at the end. Backward acquires the embeddings and
// the final layernorm first (the head and the last layernorm), releases the final layernorm, then acquires and
// releases each block from the last, and releases the embeddings at the end.
struct UnitHooks {
  std::function<void(int unit, bool backward)> acquire;
  std::function<void(int unit, bool backward)> release;
};

class Gpt {
 public:
  // Parameters, gradients and activations in `ops`' memory and element type; with `tensorParallel`, this rank's
  // part of the model cut over that communicator's ranks (its kind must be the Ops' memory's).
  explicit Gpt(const GptConfig& config, Ops& ops = cpuOps(), loomComm_t tensorParallel = nullptr,
               bool sequenceParallel = false);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  int tensorParallelSize() const { return tp_; }
  int tensorParallelRank() const { return tpRank_; }
  bool sequenceParallel() const { return sp_; }
  const GptConfig& config() const { return config_; }
  const GptLayout& layout() const { return layout_; }
  Ops& ops() const { return ops_; }

  // GPT-2's initialisation from `seed`: weights N(0, 0.02), the two residual projections of each block scaled by
  // 1/sqrt(2L), biases 0, layernorm gains 1. initialValues() is the same in fp32 on the host.
  void initialise(uint64_t seed);  // with tensor parallelism, this rank's part of the whole model's values
  static std::vector<float> initialValues(const GptLayout& layout, int layers, uint64_t seed);

  // Unit u's parameters and gradients at `params` and `grads` (ops() memory and element type) from now on (element
  // unitBegin[u] + j at [j]); null leaves that one as it was. bindDefault() points every unit back into params()
  // and grads().
  void bindUnit(int unit, void* params, void* grads);
  void bindDefault();
  // Frees the model's own parameter and/or gradient buffer, for a strategy that keeps them elsewhere (ZeRO-2 the
  // gradients, ZeRO-3 both); the units that pointed into it must be bound again before use.
  void dropStorage(bool params, bool grads);
  void setUnitHooks(UnitHooks hooks) { hooks_ = std::move(hooks); }
  bool ownsStorage() const { return params_.defined(); }

  // The flat parameters and gradients (layout() says what is where) in ops() memory; undefined without storage of
  // its own.
  Tensor& params() { return params_; }
  const Tensor& params() const { return params_; }
  Tensor& grads() { return grads_; }

  // Runs the model on tokens [B, T] (B * T int32, T <= maxT); with targets, returns the mean cross-entropy, else 0.
  // Keeps the activations for backward().
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // The logits [B, T, V] of the last forward() (ops() memory and element type).
  const Tensor& logits() const { return acts_.logits; }
  // Adds the gradients of lossScale times the last forward's mean loss to the units' gradients (zeroGrads() first
  // for a fresh step; lossScale 1/k for one of k accumulated micro-batches).
  void backward(float lossScale = 1.0f);
  void zeroGrads() { grads_.zero(); }
  // The sum of squares of the gradients of elements [begin, end) of this rank's buffer (`grads` holding element
  // gradsBase at [0]), counting parameters that every tensor-parallel rank holds whole only on its rank 0; and the
  // sum over the tensor-parallel ranks of such a value. Together: this rank's share of the global norm.
  double gradientSquares(const void* grads, size_t begin, size_t end, size_t gradsBase) const;
  double sumOverTensorParallel(double value);
  // Bytes of the activations the last forward keeps for backward (all layers, the logits and probabilities
  // included), and of the buffers backward computes their gradients in.
  size_t activationBytes() const;
  size_t activationGradientBytes() const;

 private:
  struct Activations {
    Tensor encoded, ln1, ln1Mean, ln1Rstd, qkv, attY, att, attProj, residual2, ln2, ln2Mean, ln2Rstd, fc, fcGelu,
        fcProj, residual3, lnf, lnfMean, lnfRstd, logits, probs, losses;
  };
  struct Block {
    void *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcProjw, *fcProjb;
  };
  // A block's tensors in a unit's storage.
  Block block(void* unit) const;
  // Element `at` of a tensor (or of a unit's storage) in the model's element type.
  void* at(Tensor& tensor, size_t elements) { return elementAt(ops_, tensor.data(), elements); }
  void* at(void* unit, size_t elements) const { return elementAt(ops_, unit, elements); }
  Tensor zeros(std::vector<int64_t> shape) { return Tensor::zeros(std::move(shape), ops_.dtype(), &ops_); }
  // The sum (or maximum) over the tensor-parallel ranks of n elements at `data`, in place; nothing without them.
  void tensorParallelAllReduce(void* data, size_t n, loomDataType_t type, loomRedOp_t op);
  // The rows around a tensor-parallel region, C values each. gatherRows: the input of a column-parallel layer, all
  // B x T rows (`local` itself without sequence parallelism, else this rank's rows gathered into `scratch`).
  // finishRows: a row-parallel layer's partial output over all rows, summed over the ranks into `out` (in place
  // without sequence parallelism, else reduce-scattered to this rank's rows). partialBuffer: where that partial
  // output goes: `out` itself, or `scratch`.
  void* gatherRows(void* local, Tensor& scratch);
  void* partialBuffer(void* out, Tensor& scratch);
  void finishRows(void* partial, void* out);
  // A layernorm's backward over this rank's rows, adding to `dparams` (its weight's gradient, then its bias's); with
  // sequence parallelism the parameters' share of these rows is summed over the ranks first.
  void layernormBackward(void* dinp, void* dparams, const void* dout, const void* inp, const void* weight,
                         const float* mean, const float* rstd);
  // Uploads tokens as this rank's rows of the vocabulary see them: id - first row, or -1 for another rank's.
  void uploadLocalIds(Tensor& ids, const int32_t* tokens, int n);
  float crossEntropy(int BT, int V);  // this forward's mean loss, from the logits
  Tensor floats(std::vector<int64_t> shape) { return Tensor::zeros(std::move(shape), DType::kFloat32, &ops_); }
  void reserve(int B, int T);
  void acquire(int unit, bool backward) {
    if (hooks_.acquire) hooks_.acquire(unit, backward);
  }
  void release(int unit, bool backward) {
    if (hooks_.release) hooks_.release(unit, backward);
  }

  GptConfig config_;
  Ops& ops_;
  loomComm_t tpComm_ = nullptr;
  int tp_ = 1, tpRank_ = 0;
  bool sp_ = false;
  int rowsHere_ = 0;  // positions this rank holds outside the tensor-parallel regions
  loomStream_t tpStream_ = nullptr;
  std::unique_ptr<Scalars> tpScalars_;  // sums of host values over the tensor-parallel ranks
  GptLayout layout_;
  Tensor params_, grads_;
  std::vector<void*> unitParams_, unitGrads_;  // by unit: where element unitBegin[u] lies
  UnitHooks hooks_;
  Activations acts_, grads2_;  // grads2_: the activations' gradients, same shapes
  Tensor tokens_, targets_;    // int32 [B, T] in ops() memory (this rank's vocabulary ids with tensor parallelism)
  Tensor crossMax_, crossSums_, crossTargets_;  // the vocabulary-parallel cross-entropy's [B T] statistics
  Tensor zeroPositions_;       // tensor-parallel ranks other than 0 add no position embedding before the all-reduce
  Tensor gathered_, partial_;  // sequence parallelism: all B x T rows of C, gathered and before reduce-scatter
  Tensor layernormGrads_;      // sequence parallelism: one layernorm's weight and bias gradients, 2C
  std::vector<float> losses_;  // the last forward's per-position losses, on the host
  bool haveTargets_ = false;
  int B_ = 0, T_ = 0;
};

}  // namespace loom::parallel
