// The trainer's forward and backward passes through its pipeline stage (one stage: the whole
// model), and what the stages share: the tied word embedding that the first and the last stage
// each hold.
//
//   MarkSharedEmbedding(model, parameters);  // before building the optimizer
//   KEEL_ASSIGN_OR_RETURN(at::Tensor loss_sum, RunStages(model, batches, runtime, options));
//   KEEL_RETURN_IF_ERROR(optimizer->Wait());
//   KEEL_RETURN_IF_ERROR(ReduceSequenceParallelGrads(model, optimizer->StepParameters(), runtime));
//   KEEL_RETURN_IF_ERROR(ReduceEmbeddingGrads(model, optimizer->StepParameters(), runtime));
#ifndef KEEL_TOOLS_RECIPE_STAGES_H_
#define KEEL_TOOLS_RECIPE_STAGES_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model_state.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/parameters.h"
#include "models/language_model.h"
#include "tools/recipe/data.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

// Marks the copies of the model's shared embedding, the first and the last stage's, as
// shared_embedding (the distributed optimizer shards them alike), and the last stage's as
// shared (the first stage's counts in the clipping norm); nothing on one stage or without a
// tie.
void MarkSharedEmbedding(const models::LanguageModel& model,
                         std::vector<gradients::NamedParameter>& parameters);

struct StageRunOptions {
  // Forward passes only (validation). Default: false.
  bool forward_only = false;
  // The last stage backpropagates its summed token loss times this. Default: 1.
  double loss_scale = 1.0;
  // The dtype of the activations between stages: the model's. Default: float32.
  at::ScalarType activation_dtype = at::kFloat;
  // Called before the last micro-batch's backward (the data-parallel sync's
  // PrepareForFinalBackward). Default: none.
  std::function<void()> before_last_backward;
  // Called instead when this rank runs no micro-batch (an epoch's short last step gives it
  // none: the sync's SkipBackward). Default: none.
  std::function<void()> without_backward;
};

// How one step's losses and gradients are scaled (NeMo's and Megatron's arithmetic): the
// gradients are averaged over the ranks that reduce them (data x context parallel:
// runtime.gradient_group()), so each rank's summed token loss is scaled to make them sum to d(mean
// loss over the global batch's label tokens); over pipeline stages the loss is summed instead and
// NeMo's PP scaling divides the gradients after the backward passes.
struct StepScaling {
  // StageRunOptions::loss_scale.
  double loss_scale = 1.0;
  // The weight of each micro-batch's load-balancing loss in the gradients (the model's
  // moe_stats().aux_loss_scale): 1 / micro-batches, once PP scaling has divided them.
  double aux_loss_scale = 1.0;
  // What ClipGradNorm divides the gradients by first: PP scaling, and NeMo's EP scaling (an
  // expert's gradient gathers every expert-parallel rank's tokens, then averages over the
  // expert data-parallel ranks only).
  gradients::GradScalingOptions gradients;
};

// The scaling of a step over `label_tokens` (the global batch's) in `micro_batches` on this
// rank. 0 label tokens (every label masked) give infinite scales, which the non-finite check
// then stops or skips. Requires: micro_batches > 0.
StepScaling ScaleStep(int64_t label_tokens, int64_t micro_batches, const TrainRuntime& runtime);

// The defined micro-batches of `batches` through this rank's stage over runtime.pipeline_group(),
// in the 1F1B order (parallel::RunPipeline); every stage of a pipeline reads the same batches.
// Returns the summed token loss over the labels that count (the last stage's; 0 on the
// others), each micro-batch's float32 sum added in float64 on runtime.device: a 0-d tensor
// that nothing waits for until it is read. Collective: over the tensor-parallel and pipeline
// groups. Errors: RunPipeline's.
[[nodiscard]] absl::StatusOr<at::Tensor> RunStages(models::LanguageModel& model,
                                                   const std::vector<TokenBatch>& batches,
                                                   const TrainRuntime& runtime,
                                                   const StageRunOptions& options);

// Megatron's all-reduce of the sequence-parallel gradients (finalize_model_grads' norms and
// biases): the gradients of the model's SequenceParallelParameters among `parameters` (after
// the data-parallel sync: whole parameters, or the distributed optimizer's shards of them, which
// the tensor-parallel ranks cut alike) summed over runtime.tensor_group() in one all-reduce, so
// that each is the whole sequence's; a missing gradient counts as zeros. Nothing without
// sequence parallelism. Collective: over the tensor-parallel group. Errors: kUnavailable from
// peers.
[[nodiscard]] absl::Status ReduceSequenceParallelGrads(
    const models::LanguageModel& model, const std::vector<gradients::NamedParameter>& parameters,
    const TrainRuntime& runtime);

// Megatron's embedding-group all-reduce: the gradients of the first and last stage's copies of
// the model's shared embedding (among `parameters`, after the data-parallel sync) summed, so
// that both copies take the same step; a missing gradient counts as zeros. Nothing without
// runtime.embedding_group() or a shared embedding.
// Collective: over the embedding group. Errors: kUnavailable from peers.
[[nodiscard]] absl::Status ReduceEmbeddingGrads(
    const models::LanguageModel& model, const std::vector<gradients::NamedParameter>& parameters,
    const TrainRuntime& runtime);

// The keys that ModelState(model, options) gives the other stages of this rank's pipeline
// (tied ones included): what a stage leaves to them when it reads the whole model's files
// (checkpoint::LoadHfSafetensors' held_elsewhere). Empty on one stage.
// Collective: over runtime.pipeline_host_group(). Errors: kUnavailable from peers; ModelState's.
[[nodiscard]] absl::StatusOr<std::set<std::string>> KeysOfOtherStages(
    torch::nn::Module& model, const checkpoint::ModelStateOptions& options,
    const TrainRuntime& runtime);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_STAGES_H_
