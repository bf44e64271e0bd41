#include "optim/distributed_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "optim/optimizer_kind.h"

namespace keel::optim {

namespace {

// The distributed optimizer owns its gradients: with float32 parameters only, each backward's
// gradients go straight into the buckets (main gradients of their own dtype) and .grad is
// freed, so that no rank keeps a whole .grad beside its bucket. Other dtypes keep .grad unless
// options.main_grad_dtype is set (Megatron's mixed precision).
gradients::DataParallelGradSyncOptions OwningTheGradients(
    gradients::DataParallelGradSyncOptions options, const std::vector<at::Tensor>& params) {
  if (options.main_grad_dtype.has_value()) return options;
  for (const at::Tensor& param : params) {
    if (param.defined() && param.scalar_type() != at::kFloat) return options;
  }
  options.main_grad_dtype = at::kFloat;
  return options;
}

std::vector<at::Tensor> TensorsOf(const std::vector<gradients::NamedParameter>& parameters) {
  std::vector<at::Tensor> tensors;
  for (const gradients::NamedParameter& p : parameters) tensors.push_back(p.param);
  return tensors;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    std::vector<ShardingGroup> groups, const ShardOptimizerFactory& factory,
    const gradients::DataParallelGradSyncOptions& options) {
  std::vector<at::Tensor> all;
  for (const ShardingGroup& g : groups) {
    for (const at::Tensor& param : TensorsOf(g.parameters)) all.push_back(param);
  }
  const gradients::DataParallelGradSyncOptions owning = OwningTheGradients(options, all);
  std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs;
  for (ShardingGroup& g : groups) {
    if (g.parameters.empty()) continue;
    if (g.group == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("parameters ('", g.parameters.front().name,
                                                     "' and ", g.parameters.size() - 1,
                                                     " other(s)) to shard without a group"));
    }
    KEEL_ASSIGN_OR_RETURN(syncs.emplace_back(), gradients::ShardedGradSync::Create(
                                                    std::move(g.parameters), *g.group, owning));
  }
  return Make(std::move(syncs), factory);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    std::vector<gradients::NamedParameter> parameters, c10d::ProcessGroup& group,
    const ShardOptimizerFactory& factory, const gradients::DataParallelGradSyncOptions& options) {
  const gradients::DataParallelGradSyncOptions owning =
      OwningTheGradients(options, TensorsOf(parameters));
  std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs;
  KEEL_ASSIGN_OR_RETURN(syncs.emplace_back(),
                        gradients::ShardedGradSync::Create(std::move(parameters), group, owning));
  return Make(std::move(syncs), factory);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Create(
    torch::nn::Module& module, c10d::ProcessGroup& group, const ShardOptimizerFactory& factory,
    const gradients::DataParallelGradSyncOptions& options) {
  std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs;
  KEEL_ASSIGN_OR_RETURN(
      syncs.emplace_back(),
      gradients::ShardedGradSync::Create(
          module, group, OwningTheGradients(options, module.parameters(/*recurse=*/true))));
  return Make(std::move(syncs), factory);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>> DistributedOptimizer::Make(
    std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs,
    const ShardOptimizerFactory& factory) {
  std::vector<gradients::ParamShard> shards;
  for (const auto& sync : syncs) {
    shards.insert(shards.end(), sync->shards().begin(), sync->shards().end());
  }
  // With main gradients, the optimizer steps the shards' main copies.
  std::optional<internal::MainCopies> main;
  if (!shards.empty() && shards.front().main_grad.defined()) {
    std::vector<at::Tensor> views;
    for (const gradients::ParamShard& shard : shards) views.push_back(shard.tensor);
    KEEL_ASSIGN_OR_RETURN(main, internal::MainCopies::Create(std::move(views)));
    for (size_t i = 0; i < shards.size(); ++i) {
      shards[i].tensor = main->main()[i];
      shards[i].main_grad = at::Tensor();
    }
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInvalidArgument,
                                       "building the shards' optimizer",
                                       [&] { optimizer = factory(shards); }));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const gradients::ParamShard& shard : shards) tensors.emplace_back(shard.name, shard.tensor);
  KEEL_RETURN_IF_ERROR(CheckOptimizerHoldsEachOnce(optimizer.get(), tensors, "shard"));
  return std::unique_ptr<DistributedOptimizer>(new DistributedOptimizer(
      std::move(syncs), std::move(shards), std::move(main), std::move(optimizer)));
}

DistributedOptimizer::DistributedOptimizer(
    std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs,
    std::vector<gradients::ParamShard> shards, std::optional<internal::MainCopies> main,
    std::unique_ptr<torch::optim::Optimizer> optimizer)
    : syncs_(std::move(syncs)),
      shards_(std::move(shards)),
      main_(std::move(main)),
      optimizer_(std::move(optimizer)) {
  for (const auto& sync : syncs_) {
    model_shards_.insert(model_shards_.end(), sync->shards().begin(), sync->shards().end());
  }
}

bool DistributedOptimizer::has_main_copies() const { return main_.has_value() && main_->any(); }

void DistributedOptimizer::PrepareForGradAccumulation() {
  for (const auto& sync : syncs_) sync->PrepareForGradAccumulation();
}

void DistributedOptimizer::PrepareForFinalBackward() {
  for (const auto& sync : syncs_) sync->PrepareForFinalBackward();
}

void DistributedOptimizer::SkipBackward() {
  for (const auto& sync : syncs_) sync->SkipBackward();
}

absl::Status DistributedOptimizer::Wait() {
  absl::Status status;  // the first error; every sync waits whatever failed before it
  for (const auto& sync : syncs_) status.Update(sync->Wait());
  KEEL_RETURN_IF_ERROR(status);
  // The main gradients become the gradients of what the optimizer steps (float32).
  return base::CallTorch(absl::StatusCode::kInternal, "handing over the main gradients", [&] {
    for (size_t i = 0; i < shards_.size(); ++i) {
      const at::Tensor& main_grad = model_shards_[i].main_grad;
      if (!main_grad.defined()) continue;
      at::Tensor tensor = shards_[i].tensor;
      tensor.mutable_grad() = main_grad.to(tensor.scalar_type());
    }
  });
}

std::vector<gradients::NamedParameter> DistributedOptimizer::ShardParameters() const {
  std::vector<gradients::NamedParameter> parameters;
  for (const auto& sync : syncs_) {
    std::vector<gradients::NamedParameter> group = sync->ShardParameters();
    parameters.insert(parameters.end(), group.begin(), group.end());
  }
  for (size_t i = 0; i < parameters.size(); ++i) parameters[i].param = shards_[i].tensor;
  return parameters;
}

absl::Status DistributedOptimizer::Step() {
  // A step that throws on one rank still joins the all-gathers, whose agreement then fails
  // every rank: returning early would leave the peers waiting in them.
  absl::Status stepped = base::CallTorch(absl::StatusCode::kInternal, "stepping the shards",
                                         [&] { optimizer_->step(); });
  if (stepped.ok() && main_.has_value()) stepped = main_->ToModel();
  absl::Status status;
  for (const auto& sync : syncs_) status.Update(sync->AllGather(stepped));
  return status;
}

absl::Status DistributedOptimizer::CopyMainToModel() {
  if (!has_main_copies()) return absl::OkStatus();
  const absl::Status copied = main_->ToModel();
  absl::Status status;
  for (const auto& sync : syncs_) status.Update(sync->AllGather(copied));
  return status;
}

void DistributedOptimizer::CopyModelToMain() {
  if (main_.has_value()) main_->FromModel();
}

void DistributedOptimizer::ZeroGrad() {
  for (const auto& sync : syncs_) {
    for (const gradients::NamedParameter& p : sync->parameters()) {
      at::Tensor param = p.param;
      param.mutable_grad().reset();
    }
  }
  for (const auto* shards : {&shards_, &model_shards_}) {
    for (const gradients::ParamShard& shard : *shards) {
      at::Tensor tensor = shard.tensor;
      tensor.mutable_grad().reset();
    }
  }
}

at::Tensor DistributedOptimizer::LocalGradientSum() const {
  at::Tensor sum;
  for (const auto& sync : syncs_) {
    const at::Tensor local = sync->LocalGradientSum();
    if (local.defined()) sum = sum.defined() ? sum + local : local;
  }
  return sum;
}

int64_t DistributedOptimizer::shard_numel() const {
  int64_t numel = 0;
  for (const auto& sync : syncs_) numel += sync->shard_numel();
  return numel;
}

}  // namespace keel::optim
