#include "optim/data_parallel_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "optim/optimizer_kind.h"

namespace keel::optim {
namespace {

std::vector<gradients::NamedParameter> AsParameters(
    const std::vector<gradients::ParamShard>& shards) {
  std::vector<gradients::NamedParameter> params;
  for (const gradients::ParamShard& shard : shards) {
    params.push_back({shard.name, shard.tensor, shard.layout});
  }
  return params;
}

// The factory's optimizer over the parameters themselves, checked.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> BuildWhole(
    const std::vector<gradients::NamedParameter>& parameters, const OptimizerFactory& factory) {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInvalidArgument, "building the optimizer",
                                       [&] { optimizer = factory(parameters); }));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const gradients::NamedParameter& p : parameters) tensors.emplace_back(p.name, p.param);
  KEEL_RETURN_IF_ERROR(CheckOptimizerHoldsEachOnce(optimizer.get(), tensors, "parameter"));
  return optimizer;
}

// A sync of `parameters` over `group`; with main gradients a local one without a group; none
// without parameters, or without a group and main gradients.
absl::StatusOr<std::unique_ptr<gradients::DataParallelGradSync>> SyncOf(
    const std::vector<gradients::NamedParameter>& parameters, c10d::ProcessGroup* group,
    const gradients::DataParallelGradSyncOptions& options) {
  if (parameters.empty()) return nullptr;
  if (group != nullptr) return gradients::DataParallelGradSync::Create(parameters, *group, options);
  if (!options.main_grad_dtype.has_value()) return nullptr;
  return gradients::DataParallelGradSync::CreateLocal(parameters, options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataParallelOptimizer>> DataParallelOptimizer::Create(
    std::vector<gradients::NamedParameter> parameters, c10d::ProcessGroup* group,
    const OptimizerFactory& factory, const DataParallelOptimizerOptions& options) {
  std::unique_ptr<DataParallelOptimizer> optimizer(
      new DataParallelOptimizer(std::move(parameters), options));
  DataParallelOptimizer& o = *optimizer;
  std::vector<gradients::NamedParameter> dense, experts;
  for (const gradients::NamedParameter& p : o.parameters_) {
    (gradients::HasLayoutDim(p, options.expert_dim_name) ? experts : dense).push_back(p);
  }
  if (group != nullptr && options.use_distributed_optimizer) {
    KEEL_ASSIGN_OR_RETURN(
        o.sharded_,
        DistributedOptimizer::Create(
            {{std::move(dense), group}, {std::move(experts), options.expert_data_parallel_group}},
            [&factory](const std::vector<gradients::ParamShard>& shards) {
              return factory(AsParameters(shards));
            },
            options.sync));
  } else {
    if (options.sync.main_grad_dtype.has_value()) {
      std::vector<at::Tensor> params;
      for (const gradients::NamedParameter& p : o.parameters_) params.push_back(p.param);
      KEEL_ASSIGN_OR_RETURN(o.main_, internal::MainCopies::Create(std::move(params)));
    }
    KEEL_ASSIGN_OR_RETURN(o.whole_, BuildWhole(o.StepParameters(), factory));
    KEEL_ASSIGN_OR_RETURN(o.sync_, SyncOf(dense, group, options.sync));
    KEEL_ASSIGN_OR_RETURN(o.expert_sync_,
                          SyncOf(experts, options.expert_data_parallel_group, options.sync));
    if (o.main_.has_value()) {
      // Each parameter's main gradient, in the order of the dense and the expert syncs.
      size_t dense_index = 0, expert_index = 0;
      for (const gradients::NamedParameter& p : o.parameters_) {
        o.main_grads_.push_back(gradients::HasLayoutDim(p, options.expert_dim_name)
                                    ? o.expert_sync_->MainGrad(expert_index++)
                                    : o.sync_->MainGrad(dense_index++));
      }
    }
  }
  for (const auto& group_options : o.optimizer().param_groups()) {
    o.initial_options_.push_back(group_options.options().clone());
  }
  return optimizer;
}

DataParallelOptimizer::DataParallelOptimizer(std::vector<gradients::NamedParameter> parameters,
                                             const DataParallelOptimizerOptions& options)
    : parameters_(std::move(parameters)), options_(options) {}

void DataParallelOptimizer::PrepareForGradAccumulation() {
  if (sharded_) sharded_->PrepareForGradAccumulation();
  if (sync_) sync_->PrepareForGradAccumulation();
  if (expert_sync_) expert_sync_->PrepareForGradAccumulation();
}

void DataParallelOptimizer::PrepareForFinalBackward() {
  if (sharded_) sharded_->PrepareForFinalBackward();
  if (sync_) sync_->PrepareForFinalBackward();
  if (expert_sync_) expert_sync_->PrepareForFinalBackward();
}

void DataParallelOptimizer::SkipBackward() {
  if (sharded_) sharded_->SkipBackward();
  if (sync_) sync_->SkipBackward();
  if (expert_sync_) expert_sync_->SkipBackward();
}

absl::Status DataParallelOptimizer::Wait() {
  if (sharded_) return sharded_->Wait();
  // Both syncs finish whatever the first returns, so that every group's collectives pair.
  absl::Status status;  // the first error
  for (gradients::DataParallelGradSync* sync : {sync_.get(), expert_sync_.get()}) {
    if (sync != nullptr) status.Update(sync->Wait());
  }
  KEEL_RETURN_IF_ERROR(status);
  // The main gradients become the gradients of what the optimizer steps (float32).
  if (!main_.has_value()) return absl::OkStatus();
  return base::CallTorch(absl::StatusCode::kInternal, "handing over the main gradients", [&] {
    for (size_t i = 0; i < main_grads_.size(); ++i) {
      at::Tensor main = main_->main()[i];
      main.mutable_grad() = main_grads_[i].to(at::kFloat);
    }
  });
}

std::vector<gradients::NamedParameter> DataParallelOptimizer::StepParameters() const {
  if (sharded_) return sharded_->ShardParameters();
  std::vector<gradients::NamedParameter> stepped = parameters_;
  if (main_.has_value()) {
    for (size_t i = 0; i < stepped.size(); ++i) stepped[i].param = main_->main()[i];
  }
  return stepped;
}

absl::StatusOr<at::Tensor> DataParallelOptimizer::ClipGradNorm(
    std::optional<double> max_norm, const gradients::GradScalingOptions& scaling) {
  return gradients::ScaleGradsAndClipGradNorm(max_norm, StepParameters(), scaling, options_.clip);
}

absl::Status DataParallelOptimizer::Step() {
  if (sharded_) {
    KEEL_RETURN_IF_ERROR(sharded_->Step());
    sharded_->ZeroGrad();
    return absl::OkStatus();
  }
  if (!main_.has_value()) {
    return base::CallTorch(absl::StatusCode::kInternal, "the optimizer step", [&] {
      whole_->step();
      whole_->zero_grad();
    });
  }
  const absl::Status stepped =
      base::CallTorch(absl::StatusCode::kInternal, "the optimizer step", [&] { whole_->step(); });
  SkipStep();  // the main gradients are views of the buckets: dropped, not zeroed
  KEEL_RETURN_IF_ERROR(stepped);
  return main_->ToModel();
}

void DataParallelOptimizer::SkipStep() {
  if (sharded_) {
    sharded_->ZeroGrad();
  } else if (main_.has_value()) {
    for (at::Tensor main : main_->main()) main.mutable_grad().reset();
  } else {
    whole_->zero_grad();
  }
}

bool DataParallelOptimizer::has_main_copies() const {
  if (sharded_) return sharded_->has_main_copies();
  return main_.has_value() && main_->any();
}

absl::Status DataParallelOptimizer::CopyMainToModel() {
  if (sharded_) return sharded_->CopyMainToModel();
  return main_.has_value() ? main_->ToModel() : absl::OkStatus();
}

void DataParallelOptimizer::CopyModelToMain() {
  if (sharded_) return sharded_->CopyModelToMain();
  if (main_.has_value()) main_->FromModel();
}

at::Tensor DataParallelOptimizer::LocalGradientSum() const {
  if (sharded_) return sharded_->LocalGradientSum();
  at::Tensor sum;
  for (const auto* sync : {sync_.get(), expert_sync_.get()}) {
    if (sync == nullptr) continue;
    sum = sum.defined() ? sum + sync->LocalGradientSum() : sync->LocalGradientSum();
  }
  if (sync_ != nullptr) return sum;
  // No reduction replaced this rank's gradients: they are still its own. (With main gradients
  // every parameter has a sync.)
  for (const gradients::NamedParameter& p : parameters_) {
    const at::Tensor grad = p.param.grad();
    if (!grad.defined()) continue;
    const at::Tensor part = grad.sum(at::kDouble);
    sum = sum.defined() ? sum + part : part;
  }
  return sum;
}

void DataParallelOptimizer::Reset() {
  torch::optim::Optimizer& o = optimizer();
  o.state().clear();
  for (size_t i = 0; i < o.param_groups().size(); ++i) {
    o.param_groups()[i].set_options(initial_options_[i]->clone());
  }
  CopyModelToMain();
}

torch::optim::Optimizer& DataParallelOptimizer::optimizer() {
  return sharded_ ? sharded_->optimizer() : *whole_;
}

std::string DataParallelOptimizer::Describe() const {
  const torch::optim::Optimizer& o = sharded_ ? sharded_->optimizer() : *whole_;
  const absl::StatusOr<OptimizerKind> kind = KindOf(o);
  const std::string name = absl::StrCat(kind.ok() ? OptimizerKindName(*kind) : "optimizer",
                                        has_main_copies() ? " over float32 main parameters" : "");
  if (!sharded_) return name;
  int64_t total = 0;
  for (const gradients::ParamShard& shard : sharded_->shards()) {
    int64_t numel = 1;
    for (int64_t size : shard.layout.global_shape) numel *= size;
    total += numel;
  }
  const bool experts = std::any_of(parameters_.begin(), parameters_.end(), [&](const auto& p) {
    return gradients::HasLayoutDim(p, options_.expert_dim_name);
  });
  return absl::StrCat(name, " sharded over the data-parallel ranks",
                      experts ? ", experts over the expert data-parallel ones" : "", " (",
                      sharded_->shard_numel(), " of ", total, " parameters' state here)");
}

}  // namespace keel::optim
