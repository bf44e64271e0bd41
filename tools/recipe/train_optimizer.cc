#include "tools/recipe/train_optimizer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "gradients/clip_grad_norm.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::tools::recipe {
namespace {

torch::optim::AdamWOptions AdamWOptions(const OptimizerOptions& o) {
  return torch::optim::AdamWOptions(o.lr)
      .betas({o.beta1, o.beta2})
      .eps(o.eps)
      .weight_decay(o.weight_decay);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainOptimizer>> TrainOptimizer::Create(const TrainOptions& options,
                                                                       torch::nn::Module& model,
                                                                       c10d::ProcessGroup* group) {
  std::unique_ptr<TrainOptimizer> optimizer(new TrainOptimizer(options, model));
  const torch::optim::AdamWOptions adamw = AdamWOptions(options.optimizer);
  if (group != nullptr && options.distributed.use_distributed_optimizer) {
    KEEL_ASSIGN_OR_RETURN(
        optimizer->sharded_,
        optim::DistributedOptimizer::Create(
            model, *group, [&adamw](const std::vector<gradients::ParamShard>& shards) {
              std::vector<at::Tensor> tensors;
              for (const gradients::ParamShard& shard : shards) tensors.push_back(shard.tensor);
              return std::make_unique<torch::optim::AdamW>(tensors, adamw);
            }));
    return optimizer;
  }
  std::vector<at::Tensor> tensors;
  for (const gradients::NamedParameter& p : gradients::TrainableParameters({&model})) {
    tensors.push_back(p.param);
  }
  optimizer->adamw_ = std::make_unique<torch::optim::AdamW>(tensors, adamw);
  if (group != nullptr) {
    KEEL_ASSIGN_OR_RETURN(optimizer->dp_sync_,
                          gradients::DataParallelGradSync::Create(model, *group));
  }
  return optimizer;
}

TrainOptimizer::TrainOptimizer(const TrainOptions& options, torch::nn::Module& model)
    : options_(options.optimizer), model_(&model) {}

void TrainOptimizer::PrepareForGradAccumulation() {
  if (sharded_) sharded_->PrepareForGradAccumulation();
  if (dp_sync_) dp_sync_->PrepareForGradAccumulation();
}

void TrainOptimizer::PrepareForFinalBackward() {
  if (sharded_) sharded_->PrepareForFinalBackward();
  if (dp_sync_) dp_sync_->PrepareForFinalBackward();
}

absl::Status TrainOptimizer::Wait() {
  if (sharded_) return sharded_->Wait();
  if (dp_sync_) return dp_sync_->Wait();
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> TrainOptimizer::ClipGradNorm(std::optional<double> max_norm) {
  if (sharded_) {
    return gradients::ClipGradNorm(max_norm, sharded_->ShardParameters());
  }
  return gradients::ClipGradNorm(max_norm, gradients::TrainableParameters({model_}));
}

absl::Status TrainOptimizer::Step() {
  if (sharded_) {
    KEEL_RETURN_IF_ERROR(sharded_->Step());
    sharded_->ZeroGrad();
    return absl::OkStatus();
  }
  return base::CallTorch(absl::StatusCode::kInternal, "the AdamW step", [&] {
    adamw_->step();
    adamw_->zero_grad();
  });
}

void TrainOptimizer::SkipStep() {
  if (sharded_) {
    sharded_->ZeroGrad();
  } else {
    adamw_->zero_grad();
  }
}

at::Tensor TrainOptimizer::LocalGradientSum() const {
  if (sharded_) return sharded_->grad_sync().LocalGradientSum();
  if (dp_sync_) return dp_sync_->LocalGradientSum();
  return at::Tensor();
}

torch::optim::Optimizer& TrainOptimizer::optimizer() {
  return sharded_ ? sharded_->optimizer() : *adamw_;
}

absl::StatusOr<checkpoint::OptimizerState> TrainOptimizer::CheckpointState(
    optim::ParamScheduler* scheduler) {
  if (sharded_) return checkpoint::OptimizerState::Create(*sharded_, scheduler);
  return checkpoint::OptimizerState::Create(*model_, *adamw_, scheduler);
}

void TrainOptimizer::Reset() {
  torch::optim::Optimizer& o = optimizer();
  o.state().clear();
  for (auto& group : o.param_groups()) {
    group.set_options(std::make_unique<torch::optim::AdamWOptions>(AdamWOptions(options_)));
  }
}

std::string TrainOptimizer::Describe() const {
  if (!sharded_) return "AdamW";
  const gradients::ShardedGradSync& sync = sharded_->grad_sync();
  int64_t total = 0;
  for (const gradients::ParamShard& shard : sync.shards()) {
    int64_t numel = 1;
    for (int64_t size : shard.layout.global_shape) numel *= size;
    total += numel;
  }
  return absl::StrCat("AdamW sharded over the data-parallel ranks (", sync.shard_numel(), " of ",
                      total, " parameters' state here)");
}

}  // namespace keel::tools::recipe
