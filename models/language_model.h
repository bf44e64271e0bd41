// What the trainer, the pipeline stages, checkpoints and clipping know of a model: a decoder-only
// language model split into pipeline stages (each rank builds its own stage) and over tensor-
// and expert-parallel groups, whose parameters report their layouts over the mesh. Each family
// (models/gpt.h, models/llama.h) implements it; nothing outside models/ names a family's class.
//
//   std::shared_ptr<LanguageModel> model = BuildLanguageModel(options, groups);
//   at::Tensor hidden = model->StageForward(tokens, previous_stage_output, /*packed=*/nullptr);
//   if (model->last_stage()) loss = model->HeadLosses(hidden, labels).sum();
#ifndef KEEL_MODELS_LANGUAGE_MODEL_H_
#define KEEL_MODELS_LANGUAGE_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "base/attention.h"
#include "parallel/layout.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::models {

// The groups a model is split over (nullptr: one rank). They outlive the model.
struct ModelGroups {
  c10d::ProcessGroup* tp = nullptr;
  c10d::ProcessGroup* pp = nullptr;
  c10d::ProcessGroup* ep = nullptr;
  c10d::ProcessGroup* expert_tp = nullptr;
  // Megatron's sequence_parallel, with a tp of more than one rank (nothing otherwise): the
  // embedding's output, the norms and the residual stream between the tensor-parallel layers,
  // and the activations between pipeline stages hold this rank's 1/tp of the sequence; the
  // output layer gathers it; mixture-of-experts blocks gather the whole sequence. Default:
  // false.
  bool sequence_parallel = false;
};

// What the mixture-of-experts blocks of a model routed in training since it was last taken,
// and the weight each micro-batch's load-balancing loss gets in the backward pass.
struct MoeStats {
  // The load-balancing losses (each block's, each micro-batch's), summed: a float64 scalar on
  // the model's device (no host synchronisation per block); undefined before any.
  at::Tensor aux_loss_sum;
  // Tokens routed to each expert (summed over the blocks), [num_moe_experts] int64 on the
  // model's device; undefined before any.
  at::Tensor tokens;
  // The gradient the load-balancing loss of a micro-batch receives (Megatron's
  // MoEAuxLossAutoScaler scale: 1 / the micro-batches of a step on a rank, times what the
  // gradients are divided by after the backward pass, if anything). Default: 1.
  double aux_loss_scale = 1.0;

  void Add(const at::Tensor& aux_loss, const at::Tensor& tokens_per_expert);
  // The sums so far ([1] float64, and [num_experts] int64: zeros before any), reset to none.
  std::pair<at::Tensor, at::Tensor> Take(int64_t num_experts);
};

// The elements of the parameters one rank of a pipeline stage holds, counted from the shapes
// the model registers, without building it (for --dry_run's memory): the experts' apart, as
// their state is sharded over the expert data-parallel ranks.
struct StageParameters {
  int64_t dense = 0;
  int64_t experts = 0;
};

// The layers of stage `stage` of `stages` in the even split of `num_layers` (Megatron's), and
// those of this rank's stage in the split over `pp`. Requires: a split the configuration's
// checks accepted.
parallel::StageLayers StageLayersOf(int64_t num_layers, int64_t stages, int64_t stage);
parallel::StageLayers StageLayersOf(int64_t num_layers, c10d::ProcessGroup* pp);

// A family's initialisation of its one-rank model: the draws, parameter by parameter in order.
using InitPlan = std::function<std::vector<parallel::WholeInitStep>(const torch::nn::Module&)>;

// Megatron's master-weight initialisation, one parameter at a time: `plan` of `model` itself
// when it is `whole` (the one-rank model), else of the same model on one rank that
// `build_one_rank` builds (with `model`'s padded vocabulary) under parallel::MetaParameters,
// names and shapes without memory; each rank keeps its blocks of the draws
// (parallel::InitialiseFromWholeSteps), so that the weights do not depend on the layout. Extra
// memory: the largest parameter. Requires: a one-rank model whose names and shapes fit `model`
// (an internal error otherwise).
void InitialiseAsOneRankModel(
    torch::nn::Module& model, bool whole, const InitPlan& plan,
    const std::function<std::unique_ptr<torch::nn::Module>()>& build_one_rank);

class LanguageModel : public torch::nn::Module {
 public:
  // This stage's blocks over the embedded `tokens` ([batch, seq] int64; first stage) or the
  // previous stage's output `input` (the others): [batch, seq, hidden_size()]. With `packed`
  // (else nullptr) the rows hold the sequences it describes, each from position 0 and attending
  // within itself only (base::PackedCausalAttention). Under sequence parallelism `input` and the
  // result hold this rank's share of the sequence (ActivationShape). Requires: `packed` of
  // tokens' shape, on the model's device; under sequence parallelism a sequence length that
  // tp's size divides.
  virtual at::Tensor StageForward(const at::Tensor& tokens, const at::Tensor& input,
                                  const base::PackedSequences* packed) = 0;
  // This rank's slice of the logits over the last blocks' hidden states (StageForward's, this
  // rank's share of the sequence under sequence parallelism): [batch, seq, padded vocabulary /
  // tp], the whole sequence. Requires: the last stage.
  virtual at::Tensor Logits(const at::Tensor& hidden) = 0;
  // The float32 cross-entropy of predicting `labels` ([batch, seq]) at every position from the
  // last blocks' hidden states, equal on every rank of the tensor-parallel group.
  // Collective over it, forward and backward. Requires: the last stage.
  virtual at::Tensor HeadLosses(const at::Tensor& hidden, const at::Tensor& labels) = 0;

  // The width of the activations between stages.
  virtual int64_t hidden_size() const = 0;
  // The shape of the activations between stages for tokens of `tokens_shape` [batch, seq]:
  // [batch, seq, hidden_size()], under sequence parallelism [batch, seq / tp, hidden_size()].
  std::vector<int64_t> ActivationShape(at::IntArrayRef tokens_shape) const;
  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;

  // The parameter that the first and the last stage each hold, under this name on both, when
  // the output layer is tied to the word embedding and they are different stages (Megatron's
  // shared embedding: the last stage's copy counts once in the gradient norm, and the two
  // copies' gradients are summed over the embedding group); none otherwise.
  virtual std::optional<std::string> SharedEmbedding() const = 0;

  // The whole model on one stage: this rank's logits slice for `tokens`, and the per-position
  // losses of predicting `labels` (of packed rows with `packed`). Requires: one stage.
  at::Tensor forward(const at::Tensor& tokens) { return Logits(StageForward(tokens, {}, nullptr)); }
  at::Tensor TokenLosses(const at::Tensor& tokens, const at::Tensor& labels,
                         const base::PackedSequences* packed = nullptr) {
    return HeadLosses(StageForward(tokens, {}, packed), labels);
  }

  // This stage's parameters whose rows are the vocabulary (padded: PaddedVocabSize), which a
  // Hugging Face file holds unpadded.
  virtual std::vector<std::string> VocabParameters() const = 0;

  // The layouts of this rank's sharded parameters, by name (empty on one rank).
  std::map<std::string, parallel::TensorLayout> Layouts() const;
  // The parameters whose gradients each rank of the tensor-parallel group computes from its
  // share of the sequence only (parallel::SequenceParallelParameters): empty without sequence
  // parallelism.
  std::vector<std::string> SequenceParallelParameters() const;

  // The mixture-of-experts blocks' statistics, and the load-balancing loss's weight.
  MoeStats& moe_stats() { return moe_stats_; }

 protected:
  // A stage split over `groups`.
  explicit LanguageModel(const ModelGroups& groups);
  // Whether the activations outside the tensor-parallel layers hold this rank's share of the
  // sequence (groups.sequence_parallel over a tp of more than one rank).
  bool sequence_parallel() const { return sequence_shards_ > 1; }

 private:
  // The ranks the sequence is split over between the tensor-parallel layers.
  int64_t sequence_shards_;
  MoeStats moe_stats_;
};

}  // namespace keel::models

#endif  // KEEL_MODELS_LANGUAGE_MODEL_H_
