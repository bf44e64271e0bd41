#include "models/language_model.h"

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/collectives.h"
#include "c10/util/Exception.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/layers.h"

namespace keel::models {

void MoeStats::Add(const at::Tensor& aux_loss, const at::Tensor& tokens_per_expert) {
  const at::Tensor aux = aux_loss.to(at::kDouble);
  aux_loss_sum = aux_loss_sum.defined() ? aux_loss_sum + aux : aux;
  tokens = tokens.defined() ? tokens + tokens_per_expert : tokens_per_expert;
}

std::pair<at::Tensor, at::Tensor> MoeStats::Take(int64_t num_experts) {
  at::Tensor aux =
      aux_loss_sum.defined() ? aux_loss_sum.to(at::kCPU).reshape({1}) : at::zeros({1}, at::kDouble);
  at::Tensor counts =
      tokens.defined() ? tokens.to(at::kCPU, at::kLong) : at::zeros({num_experts}, at::kLong);
  aux_loss_sum = at::Tensor();
  tokens = at::Tensor();
  return {aux, counts};
}

parallel::StageLayers StageLayersOf(int64_t num_layers, int64_t stages, int64_t stage) {
  const absl::StatusOr<parallel::StageLayers> layers = parallel::LayersOfStage(
      static_cast<int>(num_layers), static_cast<int>(stages), static_cast<int>(stage));
  TORCH_INTERNAL_ASSERT(layers.ok(), layers.status().ToString());
  return *layers;
}

parallel::StageLayers StageLayersOf(int64_t num_layers, c10d::ProcessGroup* pp) {
  return StageLayersOf(num_layers, base::GroupSize(pp), base::GroupRank(pp));
}

void InitialiseAsOneRankModel(
    torch::nn::Module& model, bool whole, const InitPlan& plan,
    const std::function<std::unique_ptr<torch::nn::Module>()>& build_one_rank) {
  std::vector<parallel::WholeInitStep> steps;
  if (whole) {
    steps = plan(model);
  } else {
    const parallel::MetaParameters meta;
    steps = plan(*build_one_rank());
  }
  const absl::Status initialised = parallel::InitialiseFromWholeSteps(model, steps);
  TORCH_INTERNAL_ASSERT(initialised.ok(), initialised.ToString());
}

LanguageModel::LanguageModel(const ModelGroups& groups)
    : sequence_shards_(groups.sequence_parallel ? base::GroupSize(groups.tp) : 1) {}

std::vector<int64_t> LanguageModel::ActivationShape(at::IntArrayRef tokens_shape) const {
  return {tokens_shape[0], tokens_shape[1] / sequence_shards_, hidden_size()};
}

std::map<std::string, parallel::TensorLayout> LanguageModel::Layouts() const {
  return parallel::ParameterLayouts(*this);
}

std::vector<std::string> LanguageModel::SequenceParallelParameters() const {
  return parallel::SequenceParallelParameters(*this);
}

}  // namespace keel::models
