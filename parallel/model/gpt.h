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
// The model does the maths; what each kind of parallelism exchanges lives with it: tensor and sequence
// parallelism's in TensorParallel (strategies/tensor_parallel.h), the pipeline's tied embedding and sums over the
// stages in StageComm (pipeline/stage_comm.h), expert parallelism's in MoeLayer (moe.h), data parallelism's and
// ZeRO's in their strategies, through the unit hooks.
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
//
// Pipeline parallelism: given its place in a pipeline (PipelineStage), a rank holds only its layers. The L blocks
// are cut into p v equal runs, the virtual stages; stage s holds chunks c = 0..v-1, virtual stage c p + s (v = 1
// but for the interleaved schedule). Virtual stage 0 also holds the embeddings, the last one the final layernorm
// and a copy of the token embedding for the tied head (Megatron's): both copies start equal, and the executor sums
// their gradients across the two stages after each step's backward (synchronizeTiedGradients), so that they stay
// equal. A chunk's passes run on an activation slot, one per micro-batch in flight, so that a schedule keeps as
// many micro-batches' activations as it has in flight, and no more. A chunk's backward may stop at the inputs'
// gradients (ZB-H1's B) and leave the weights' to weightPass (its W).
//
// Mixture of experts (GptConfig::experts > 0, parallel/model/moe.h): each block's MLP is E expert MLPs behind a
// top-k router. The router lives with the block's other parameters; the experts a rank holds (all, or its E/ep with
// an expert-parallel communicator) form a unit of their own after the block's, an expert unit (GptLayout::
// expertUnit), so that a data-parallel strategy averages them over the ranks that hold the same experts. Not with
// tensor parallelism.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/kernels/ops.h"
#include "parallel/model/moe.h"
#include "parallel/pipeline/stage_comm.h"
#include "parallel/strategies/tensor_parallel.h"
#include "parallel/tensor.h"

namespace loom::parallel {

struct GptConfig {
  int layers = 2;
  int heads = 4;
  int channels = 128;
  int maxT = 64;  // the longest sequence (rows of the position embedding)
  int vocab = 256;
  // A mixture of experts in place of each MLP (0: the dense MLP): experts of `ffn` hidden units (0: 4 C), each token
  // routed to its top `topk`, at most capacityFactor N k / E tokens per expert (0: no limit), the load-balancing
  // loss weighted by auxLossCoefficient.
  int experts = 0, topk = 1, ffn = 0;
  float capacityFactor = 0;
  DropPolicy dropPolicy = DropPolicy::kPosition;
  float auxLossCoefficient = 0.01f;
  // How the MoE layer's forward dispatch moves rows between expert-parallel ranks (moe.h); not part of the model.
  ExpertDispatch expertDispatch = ExpertDispatch::kAllToAllv;
  int hidden() const { return ffn > 0 ? ffn : 4 * channels; }

  // "gpt-tiny" (L=2, H=4, C=128, T=64, V=256), "gpt2-124m" (L=12, H=12, C=768, T=1024, V=50257) or "moe-tiny"
  // (gpt-tiny with 4 experts of 256 hidden units, top-2, capacity factor 1.25); false for any other name.
  static bool preset(const std::string& name, GptConfig* out);
  // Empty, or what is wrong ("channels 100 is not divisible by heads 3").
  std::string check() const;
};

// How a parameter is cut over tensor-parallel ranks (Megatron's): whole on every rank; by rows (a column-parallel
// linear layer's output features, the vocabulary of the token embedding), in `parts` blocks each cut separately
// (QKV: q, k and v each give every rank its heads); or by columns (a row-parallel layer's input features).
enum class TensorSplit { kReplicated, kRows, kColumns };

// A rank's place in a pipeline: stage `stage` of `stages`, holding `chunks` model chunks (virtual stages c stages +
// stage).
struct PipelineStage {
  int stages = 1, stage = 0, chunks = 1;
  int virtualStages() const { return stages * chunks; }
  int virtualStage(int chunk) const { return chunk * stages + stage; }
  bool holdsEmbeddings() const { return stage == 0; }     // virtual stage 0: chunk 0 of stage 0
  bool holdsHead() const { return stage == stages - 1; }  // the last virtual stage: chunk v-1 of stage p-1
  // Empty, or why `layers` blocks do not cut into this pipeline ("8 layers do not split into 3 x 2 virtual stages").
  std::string check(int layers) const;
};

// A named range of the flat parameter buffer.
struct ParamRange {
  std::string name;            // "h.0.attn.qkv.weight", in PyTorch's naming of the same model
  size_t offset;               // elements from the buffer's start
  std::vector<int64_t> shape;  // this rank's part
  TensorSplit split = TensorSplit::kReplicated;
  int parts = 1;
  // The last stage's copy of the token embedding (tied to the first stage's): its gradient is counted there only.
  bool tiedCopy = false;
  bool expert = false;  // one of this rank's experts' parameters
  size_t numel() const;
};

// Where every parameter lies, and where each layer's range starts.
struct GptLayout {
  std::vector<ParamRange> params;
  size_t total = 0;
  // Elements [unitBegin[u], unitBegin[u + 1]) form unit u. The whole model: 0 the embeddings, 1..L the blocks, L+1
  // the final layernorm. A pipeline stage: the units it holds in that order (the embeddings, its blocks, the final
  // layernorm), then the head's copy of the token embedding on a last stage that is not also the first.
  std::vector<size_t> unitBegin;
  int tensorParallel = 1;
  PipelineStage stage;
  int expertParallel = 1, expertRank = 0;
  std::vector<bool> expertUnit;  // by unit: whether it holds experts (after its block's unit)
  // The layout of one rank's part of the model when it is cut over `tensorParallel` ranks, holds `stage`'s layers
  // and the experts of `expertRank` of `expertParallel` (the defaults: the whole model).
  static GptLayout of(const GptConfig& config, int tensorParallel = 1, const PipelineStage& stage = {},
                      int expertParallel = 1, int expertRank = 0);
  // The parameter named `name` (the head's copy of the token embedding is found as the first one only when no other
  // is held); null when this layout holds none.
  const ParamRange* find(const std::string& name) const;
  // Rank `rank`'s part of parameters in the whole model's layout (`full`, tensorParallel 1, one stage), and back:
  // unshard writes this rank's elements into the whole buffer (a tied copy writes nothing).
  void shard(const GptLayout& full, const float* fullValues, int rank, float* local) const;
  void unshard(const GptLayout& full, const float* local, int rank, float* fullValues) const;
};

// Called around every use of a unit: acquire before the model reads its parameters (and, in backward, adds to its
// gradients), release after its last use in the pass (in backward: its gradients are final). Forward acquires the
// embeddings (unit 0), each block in turn, then the final layernorm; it releases each block after it, and the final
// layernorm and the embeddings (which the tied head reads last) at the end. Backward acquires the embeddings and
// the final layernorm first (the head and the last layernorm), releases the final layernorm, then acquires and
// releases each block from the last, and releases the embeddings at the end. Only a model that is not pipelined
// calls them, and only in forward() and backward().
struct UnitHooks {
  std::function<void(int unit, bool backward)> acquire;
  std::function<void(int unit, bool backward)> release;
};

class Gpt {
 public:
  // Parameters, gradients and activations in `ops`' memory and element type; with `tensorParallel`, this rank's
  // part of the model cut over that communicator's ranks (its kind must be the Ops' memory's); with `pipeline`, the
  // layers of stage `stage` of that communicator's ranks (rank s is stage s).
  // With `expertParallel`, the experts of this rank of that communicator's.
  explicit Gpt(const GptConfig& config, Ops& ops = cpuOps(), loomComm_t tensorParallel = nullptr,
               bool sequenceParallel = false, loomComm_t pipeline = nullptr, int chunks = 1,
               loomComm_t expertParallel = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  int tensorParallelSize() const { return tp_; }
  int tensorParallelRank() const { return tpRank_; }
  bool sequenceParallel() const { return sp_; }
  const PipelineStage& stage() const { return layout_.stage; }
  bool pipelined() const { return layout_.stage.virtualStages() > 1; }
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
  // Keeps the activations for backward(). A model that is not pipelined only.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // The logits [B, T, V] of the last forward() (ops() memory and element type).
  const Tensor& logits() const { return slots_.front()->acts.logits; }
  // Adds the gradients of lossScale times the last forward's mean loss to the units' gradients (zeroGrads() first
  // for a fresh step; lossScale 1/k for one of k accumulated micro-batches).
  void backward(float lossScale = 1.0f);
  void zeroGrads() { grads_.zero(); }

  // A pipeline's passes over chunk `chunk` for the micro-batch on activation slot `slot` (any small number; slots
  // are made as they are first used and kept for reuse). forwardPass takes the tokens on the first virtual stage
  // and otherwise the previous one's output, written at passInput(chunk, slot, B, T) beforehand; on the last virtual
  // stage it needs the targets and returns the mean loss (else 0), and elsewhere leaves its output at passOutput(slot).
  // backwardPass starts from the loss (times lossScale) on the last virtual stage, and otherwise from the gradient
  // of the output written at outputGradient(slot) beforehand; it leaves the input's gradient at inputGradient(slot)
  // (but on the first virtual stage). With weights false it computes only what the input's gradient needs
  // (layernorm parameters included), and weightPass(slot) later adds the linear layers' and embeddings' weight
  // gradients from the same slot. The tokens given to forwardPass must stay readable until the slot's last pass.
  float forwardPass(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int B, int T);
  void backwardPass(int slot, float lossScale, bool weights);
  void weightPass(int slot);
  // B x T x C values (this rank's rows of them with sequence parallelism) at each boundary between virtual stages.
  size_t boundaryElements(int B, int T) const;
  void* passInput(int chunk, int slot, int B, int T);
  const void* passOutput(int slot);
  void* outputGradient(int slot);
  const void* inputGradient(int slot);
  // Adds the head's token-embedding gradients to the embeddings' across the pipeline's first and last stages, so
  // that both hold the sum (in place, on those two stages; nothing elsewhere or without a pipeline).
  void synchronizeTiedGradients();
  // The sum of squares of the gradients of elements [begin, end) of this rank's buffer (`grads` holding element
  // gradsBase at [0]), counting parameters that every tensor-parallel rank holds whole only on its rank 0; and the
  // sum over the tensor-parallel and pipeline ranks of such a value (the tied copy of the token embedding counted
  // on the first stage only). Together: this rank's share of the global norm.
  double gradientSquares(const void* grads, size_t begin, size_t end, size_t gradsBase) const;
  double sumOverModelParallel(double value);
  // Bytes of the activations kept for backward over every activation slot (one without a pipeline: all layers, the
  // logits and probabilities included), and of the buffers backward computes their gradients in.
  size_t activationBytes() const;
  size_t activationGradientBytes() const;
  int slots() const { return static_cast<int>(slots_.size()); }
  // Mixture of experts: the load-balancing loss of the last forward pass (summed over its layers, this rank's
  // tokens), and the expert assignments routed and dropped over capacity since the model was made.
  float lastAuxLoss() const { return lastAuxLoss_; }
  int64_t assignmentsRouted() const { return routed_; }
  int64_t assignmentsDropped() const { return dropped_; }

 private:
  struct Activations {
    Tensor encoded, ln1, ln1Mean, ln1Rstd, qkv, attY, att, attProj, residual2, ln2, ln2Mean, ln2Rstd, fc, fcGelu,
        fcProj, residual3, lnf, lnfMean, lnfRstd, logits, probs, losses;
  };
  struct Block {
    void *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcProjw, *fcProjb;
    void* router;  // with experts, in place of the dense MLP's
  };
  // One micro-batch's activations and their gradients on one chunk, with its tokens and loss statistics.
  struct Slot {
    Activations acts, grads;
    Tensor tokens, targets;                    // int32 [B, T] (this rank's vocabulary ids with tensor parallelism)
    Tensor crossMax, crossSums, crossTargets;  // the vocabulary-parallel cross-entropy's [B T] statistics
    std::vector<float> losses;                 // per-position losses, on the host
    std::vector<MoeState> moe;                 // each layer's routing and experts' activations
    float lossScale = 1;                       // the last backward's (the load-balancing loss's gradient in W)
    bool haveTargets = false;
    int chunk = -1, B = 0, T = 0;
  };
  // A block's tensors in a unit's storage.
  Block block(void* unit) const;
  // Element `at` of a tensor (or of a unit's storage) in the model's element type.
  void* at(Tensor& tensor, size_t elements) { return elementAt(ops_, tensor.data(), elements); }
  void* at(void* unit, size_t elements) const { return elementAt(ops_, unit, elements); }
  Tensor zeros(std::vector<int64_t> shape) { return Tensor::zeros(std::move(shape), ops_.dtype(), &ops_); }
  // A layernorm's backward over this rank's rows, adding to `dparams` (its weight's gradient, then its bias's); with
  // sequence parallelism the parameters' share of these rows is summed over the ranks first.
  void layernormBackward(void* dinp, void* dparams, const void* dout, const void* inp, const void* weight,
                         const float* mean, const float* rstd);
  // Uploads tokens as this rank's rows of the vocabulary see them: id - first row, or -1 for another rank's.
  void uploadLocalIds(Tensor& ids, const int32_t* tokens, int n);
  float crossEntropy(Slot& slot, int BT, int V);  // the slot's mean loss, from its logits
  Tensor floats(std::vector<int64_t> shape) { return Tensor::zeros(std::move(shape), DType::kFloat32, &ops_); }
  // Slot `slot`, shaped for `chunk` and B x T; the scratch buffers for B x T.
  Slot& reserve(int slot, int chunk, int B, int T);
  Slot& slotAt(int slot, const char* pass);
  bool firstChunk(int chunk) const { return layout_.stage.virtualStage(chunk) == 0; }
  bool lastChunk(int chunk) const { return layout_.stage.virtualStage(chunk) == layout_.stage.virtualStages() - 1; }
  int firstLayer(int chunk) const { return layout_.stage.virtualStage(chunk) * layersPerChunk_; }
  // The head's matmul backward, the blocks' linear layers' and the embeddings', for backwardPass and weightPass:
  // with `input` the input's gradient, with `weights` the weights' (both, but for ZB-H1's split).
  void headBackward(Slot& slot, bool input, bool weights);
  void blockBackward(Slot& slot, int layer, bool input, bool weights);
  void embeddingBackward(Slot& slot);
  void acquire(int unit, bool backward) {
    if (hooksOn_ && hooks_.acquire) hooks_.acquire(unit, backward);
  }
  void release(int unit, bool backward) {
    if (hooksOn_ && hooks_.release) hooks_.release(unit, backward);
  }

  GptConfig config_;
  Ops& ops_;
  // The tensor-parallel ranks' communication around the cut layers (f and g), and its size, rank and whether
  // sequence parallelism splits the rows outside the cut layers too.
  TensorParallel tensor_;
  int tp_ = 1, tpRank_ = 0;
  bool sp_ = false;
  int rowsHere_ = 0;  // positions this rank holds outside the tensor-parallel regions
  StageComm pipeline_;  // the pipeline's stages: the tied embedding's gradients, and sums over the stages
  GptLayout layout_;
  int layersPerChunk_ = 0;
  // Units by role: the embeddings', block l's (by global layer; -1 when another stage holds it), the final
  // layernorm's, and the one the tied head reads the token embedding from (the embeddings', or their copy).
  int embeddingUnit_ = -1, lnfUnit_ = -1, headUnit_ = -1;
  std::vector<int> blockUnit_, expertUnit_;  // expertUnit_: by global layer, its experts' unit (-1: none here)
  int ep_ = 1, epRank_ = 0;
  std::unique_ptr<MoeLayer> moe_;  // and expert parallelism's communication
  float lastAuxLoss_ = 0;
  int64_t routed_ = 0, dropped_ = 0;
  Tensor params_, grads_;
  std::vector<void*> unitParams_, unitGrads_;  // by unit: where element unitBegin[u] lies
  UnitHooks hooks_;
  bool hooksOn_ = true;  // the hooks are for a model that is not pipelined, in unsplit passes
  std::vector<std::unique_ptr<Slot>> slots_;
  Tensor zeroPositions_;       // tensor-parallel ranks other than 0 add no position embedding before the all-reduce
  Tensor layernormGrads_;      // sequence parallelism: one layernorm's weight and bias gradients, 2C
  int scratchBT_ = 0;
};

}  // namespace loom::parallel
