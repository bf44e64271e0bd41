#include "optim/distributed_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "optim/optimizer_kind.h"

namespace keel::optim {

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
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const gradients::ParamShard& shard : sync->shards()) {
    tensors.emplace_back(shard.name, shard.tensor);
  }
  KEEL_RETURN_IF_ERROR(CheckOptimizerHoldsEachOnce(optimizer.get(), tensors, "shard"));
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
