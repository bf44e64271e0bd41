#include "tools/recipe/stages.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/collectives.h"
#include "base/status.h"
#include "parallel/moe/token_dispatcher.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::tools::recipe {
namespace {

// The summed cross-entropy of next-token prediction over the labels of `batch` that count,
// from the last blocks' hidden states. Collective over the tensor-parallel group (forward and
// backward).
at::Tensor SummedTokenLoss(models::LanguageModel& model, const at::Tensor& hidden,
                           const TokenBatch& batch) {
  const at::Tensor losses = model.HeadLosses(hidden, batch.labels);
  return batch.loss_mask.defined() ? (losses * batch.loss_mask).sum() : losses.sum();
}

}  // namespace

void MarkSharedEmbedding(const models::LanguageModel& model,
                         std::vector<gradients::NamedParameter>& parameters) {
  const std::optional<std::string> shared = model.SharedEmbedding();
  for (gradients::NamedParameter& p : parameters) {
    p.shared_embedding = shared && p.name == *shared;
    p.shared = p.shared_embedding && !model.first_stage();
  }
}

StepScaling ScaleStep(int64_t label_tokens, int64_t micro_batches, const TrainRuntime& runtime) {
  const int averaged_over = base::GroupSize(runtime.gradient_group());
  const bool pipelined = runtime.pipeline_group() != nullptr;
  // A step without a learned token (conversations whose answers data.overlong "truncate" cut
  // off) has loss 0 and no gradient, not a division by zero.
  const double tokens = static_cast<double>(std::max<int64_t>(label_tokens, 1));
  StepScaling scaling;
  scaling.loss_scale = pipelined ? 1.0 : averaged_over / tokens;
  const double pp_scaling = pipelined ? tokens / averaged_over : 1.0;
  scaling.aux_loss_scale = pp_scaling / static_cast<double>(micro_batches);
  scaling.gradients.pp_enabled = pipelined;
  scaling.gradients.num_label_tokens = label_tokens;
  scaling.gradients.dp_group_size = averaged_over;
  scaling.gradients.ep_shard_size = base::GroupSize(runtime.expert_data_group());
  // Experts split over fewer ranks than the dense layers (expert tp < tp): the tensor-parallel
  // ranks' identical tokens each reach the experts, tp / expert tp copies of every token.
  scaling.gradients.expert_tp_replication_factor =
      base::GroupSize(runtime.tensor_group()) / base::GroupSize(runtime.expert_tensor_group());
  scaling.gradients.ep_axis_name = parallel::kExpertDim;
  return scaling;
}

absl::StatusOr<at::Tensor> RunStages(models::LanguageModel& model,
                                     const std::vector<TokenBatch>& batches,
                                     const TrainRuntime& runtime, const StageRunOptions& options) {
  // Expert-parallel ranks exchange tokens in every MoE block: a rank without a batch runs an
  // empty one, so that it joins its peers' all-to-alls. Its rows have as many positions as
  // there are tensor-parallel ranks, which sequence parallelism splits evenly.
  const bool expert_parallel = base::GroupSize(runtime.expert_group()) > 1;
  TokenBatch empty;
  empty.inputs = at::zeros({0, base::GroupSize(runtime.tensor_group())},
                           at::TensorOptions().dtype(at::kLong).device(runtime.device));
  empty.labels = empty.inputs;
  std::vector<const TokenBatch*> defined;
  for (const TokenBatch& batch : batches) {
    if (batch.defined()) {
      defined.push_back(&batch);
    } else if (expert_parallel) {
      defined.push_back(&empty);
    }
  }
  const auto num_micro_batches = static_cast<int64_t>(defined.size());
  at::Tensor loss_sum =
      at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(runtime.device));
  parallel::StageCallbacks stage;
  stage.activation_shape = [&](int64_t i) {
    return model.ActivationShape(defined[i]->inputs.sizes());
  };
  stage.forward = [&](int64_t i, const at::Tensor& input) {
    const TokenBatch& batch = *defined[i];
    at::Tensor hidden =
        model.StageForward(batch.inputs, input, batch.packed.defined() ? &batch.packed : nullptr);
    if (!model.last_stage()) return hidden;
    const at::Tensor loss = SummedTokenLoss(model, hidden, *defined[i]);
    loss_sum += loss.detach().to(at::kDouble);
    return loss * options.loss_scale;
  };
  stage.before_backward = [&](int64_t i) {
    if (i + 1 == num_micro_batches && options.before_last_backward) options.before_last_backward();
  };
  parallel::PipelineOptions pipeline;
  pipeline.activation_options =
      at::TensorOptions().dtype(options.activation_dtype).device(runtime.device);
  pipeline.forward_only = options.forward_only;
  KEEL_RETURN_IF_ERROR(
      parallel::RunPipeline(num_micro_batches, stage, runtime.pipeline_group(), pipeline));
  if (num_micro_batches == 0 && !options.forward_only && options.without_backward) {
    options.without_backward();
  }
  return loss_sum;
}

absl::Status ReduceSequenceParallelGrads(const models::LanguageModel& model,
                                         const std::vector<gradients::NamedParameter>& parameters,
                                         const TrainRuntime& runtime) {
  const std::vector<std::string> names = model.SequenceParallelParameters();
  const std::set<std::string> summed(names.begin(), names.end());
  std::vector<at::Tensor> params, flat_grads;
  for (const gradients::NamedParameter& p : parameters) {
    if (summed.count(p.name) == 0) continue;
    at::Tensor param = p.param;
    if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
    params.push_back(param);
    flat_grads.push_back(param.grad().reshape({-1}));
  }
  if (params.empty()) return absl::OkStatus();
  at::Tensor flat = at::cat(flat_grads);
  KEEL_RETURN_IF_ERROR(base::AllReduce(flat, base::Reduce::kSum, *runtime.tensor_group(),
                                       "the sequence-parallel parameters' gradients"));
  int64_t offset = 0;
  for (at::Tensor& param : params) {
    param.mutable_grad().copy_(flat.narrow(0, offset, param.numel()).view_as(param));
    offset += param.numel();
  }
  return absl::OkStatus();
}

absl::Status ReduceEmbeddingGrads(const models::LanguageModel& model,
                                  const std::vector<gradients::NamedParameter>& parameters,
                                  const TrainRuntime& runtime) {
  const std::optional<std::string> shared = model.SharedEmbedding();
  if (runtime.embedding_group() == nullptr || !shared) return absl::OkStatus();
  for (const gradients::NamedParameter& p : parameters) {
    if (p.name != *shared) continue;
    at::Tensor param = p.param;
    if (!param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
    at::Tensor grad = param.grad();
    return base::AllReduce(grad, base::Reduce::kSum, *runtime.embedding_group(),
                           "the tied word embedding's gradients");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> KeysOfOtherStages(
    torch::nn::Module& model, const checkpoint::ModelStateOptions& options,
    const TrainRuntime& runtime) {
  std::set<std::string> others;
  if (runtime.pipeline_host_group() == nullptr) return others;
  const checkpoint::ModelState state(model, options);
  KEEL_ASSIGN_OR_RETURN(checkpoint::State mine, state.StateDict());
  std::set<std::string> own;
  for (const auto& [key, ref] : mine.tensors) own.insert(key);
  for (const auto& [key, tied_to] : state.TiedKeys()) own.insert(key);
  KEEL_ASSIGN_OR_RETURN(
      std::vector<std::string> stages,
      base::AllGatherBytes(absl::StrJoin(own, std::string(1, '\0')), *runtime.pipeline_host_group(),
                           "the stages' tensor names"));
  for (const std::string& stage : stages) {
    for (absl::string_view key : absl::StrSplit(stage, '\0', absl::SkipEmpty())) {
      if (own.count(std::string(key)) == 0) others.emplace(key);
    }
  }
  return others;
}

}  // namespace keel::tools::recipe
