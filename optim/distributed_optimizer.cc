#include "optim/distributed_optimizer.h"

#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "optim/optimizer_kind.h"

namespace keel::optim {
namespace {

// Each shard's tensor must be in the optimizer's param groups exactly once.
absl::Status CheckHoldsEachShardOnce(const torch::optim::Optimizer& optimizer,
                                     const std::vector<gradients::ParamShard>& shards) {
  std::unordered_map<const c10::TensorImpl*, int> seen;
  for (const gradients::ParamShard& shard : shards) seen[shard.tensor.unsafeGetTensorImpl()] = 0;
  const auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    for (size_t j = 0; j < groups[i].params().size(); ++j) {
      auto it = seen.find(groups[i].params()[j].unsafeGetTensorImpl());
      if (it == seen.end() || ++it->second > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the optimizer's param_groups[", i, "].params[", j, "] is ",
            it == seen.end() ? "not a shard's tensor" : "a shard's tensor listed twice"));
      }
    }
  }
  for (const gradients::ParamShard& shard : shards) {
    if (seen[shard.tensor.unsafeGetTensorImpl()] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("the optimizer does not hold the shard of '",
                                                     shard.name,
                                                     "'; its rows would never "
                                                     "be stepped"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    std::vector<gradients::NamedParameter> parameters, c10d::ProcessGroup& group,
    const ShardOptimizerFactory& factory, const gradients::DataParallelGradSyncOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<gradients::ShardedGradSync> sync,
                        gradients::ShardedGradSync::Create(std::move(parameters), group, options));
  return Make(std::move(sync), factory);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    torch::nn::Module& module, c10d::ProcessGroup& group, const ShardOptimizerFactory& factory,
    const gradients::DataParallelGradSyncOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<gradients::ShardedGradSync> sync,
                        gradients::ShardedGradSync::Create(module, group, options));
  return Make(std::move(sync), factory);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Make(
    std::unique_ptr<gradients::ShardedGradSync> sync, const ShardOptimizerFactory& factory) {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInvalidArgument,
                                       "building the shards' optimizer",
                                       [&] { optimizer = factory(sync->shards()); }));
  if (optimizer == nullptr) {
    return absl::InvalidArgumentError("the optimizer factory returned no optimizer");
  }
  // The table's optimizers are elementwise (LBFGS's step depends on every element) and can
  // be checkpointed.
  KEEL_RETURN_IF_ERROR(KindOf(*optimizer).status());
  KEEL_RETURN_IF_ERROR(CheckHoldsEachShardOnce(*optimizer, sync->shards()));
  return std::unique_ptr<DistributedOptimizer>(
      new DistributedOptimizer(std::move(sync), std::move(optimizer)));
}

DistributedOptimizer::DistributedOptimizer(std::unique_ptr<gradients::ShardedGradSync> sync,
                                           std::unique_ptr<torch::optim::Optimizer> optimizer)
    : sync_(std::move(sync)), optimizer_(std::move(optimizer)) {}

absl::Status DistributedOptimizer::Step() {
  // A step that throws on one rank still joins the all-gather, whose agreement then fails every
  // rank: returning early would leave the peers waiting in it.
  const absl::Status stepped = base::CallTorch(absl::StatusCode::kInternal, "stepping the shards",
                                               [&] { optimizer_->step(); });
  return sync_->AllGather(stepped);
}

void DistributedOptimizer::ZeroGrad() {
  for (const gradients::NamedParameter& p : sync_->parameters()) {
    at::Tensor param = p.param;
    param.mutable_grad().reset();
  }
  for (const gradients::ParamShard& shard : sync_->shards()) {
    at::Tensor tensor = shard.tensor;
    tensor.mutable_grad().reset();
  }
}

}  // namespace keel::optim
