// Megatron-Core's distributed optimizer (megatron/core/optimizer/distrib_optimizer.py, after
// DeepSpeed's ZeRO stage 1 with stage 2's communication) for LibTorch: each data-parallel rank
// keeps the optimizer state of its shard of the parameters only, about 1/N of it; receives
// only its shard of the averaged gradients (gradients::ShardedGradSync), steps it with a
// LibTorch optimizer built over the shards, and all-gathers the updated parameters. As
// Megatron's, every rank keeps a whole gradient buffer (the buckets), and nothing beside it:
// float32 parameters' gradients go into the buckets as backward makes them and each .grad is
// freed (main gradients of their own dtype; other dtypes keep .grad unless main_grad_dtype is
// set). With main gradients
// (DataParallelGradSyncOptions::main_grad_dtype), the optimizer steps float32 main copies of the
// shards of narrower (bf16, fp16) parameters, Megatron's main parameters, whose values are then
// copied, rounded, into the parameters' rows before the all-gather.
//
//   auto adamw = [](const std::vector<gradients::ParamShard>& shards) {
//     std::vector<at::Tensor> tensors;
//     for (const auto& shard : shards) tensors.push_back(shard.tensor);
//     return std::make_unique<torch::optim::AdamW>(tensors, torch::optim::AdamWOptions(1e-3));
//   };
//   KEEL_ASSIGN_OR_RETURN(auto optimizer, DistributedOptimizer::Create(*model, *dp_group, adamw));
//   // backward passes, with PrepareFor* as DataParallelGradSync's; then Wait(), ClipGradNorm
//   // over ShardParameters(), Step() and ZeroGrad().
#ifndef KEEL_OPTIM_DISTRIBUTED_OPTIMIZER_H_
#define KEEL_OPTIM_DISTRIBUTED_OPTIMIZER_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "gradients/parameters.h"
#include "gradients/sharded_grad_sync.h"
#include "optim/internal/main_copies.h"
#include "torch/nn/module.h"
#include "torch/optim/optimizer.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::optim {

// Builds the optimizer that steps this rank's shards: its param groups must hold each shard's
// tensor exactly once (group them by ParamShard::name as the unsharded optimizer would be).
using ShardOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const std::vector<gradients::ParamShard>& shards)>;

// Parameters sharded over one group.
struct ShardingGroup {
  std::vector<gradients::NamedParameter> parameters;
  c10d::ProcessGroup* group = nullptr;
};

// A data-parallel optimizer whose state is sharded over the group (or each parameter set over
// its own: experts over the expert data-parallel group). The optimizer must be one of
// optim::OptimizerKind's (Adam, AdamW, SGD, RMSprop, Adagrad): elementwise (each element's
// update depends only on its own gradient and state), so that stepping shards equals stepping
// the whole parameters, and known to checkpoint::OptimizerState; its
// options (learning rate, weight decay) are set on optimizer() as usual, by a ParamScheduler
// for instance. Every shard is in the optimizer even without rows, so every rank's optimizer
// has the same param groups and step counts as the unsharded one.
//
// Requires: `module` and `group` outlive this object; as gradients::ShardedGradSync.
class DistributedOptimizer {
 public:
  // Shards each group's parameters over its group (Megatron's dense parameters over the
  // data-parallel group and expert ones over the expert data-parallel group; their layouts
  // travel to the shards) and builds one optimizer over all the shards, in group order. A group
  // without parameters is left out. Collective: every rank calls it, over every group.
  // Errors: as the Create below; kInvalidArgument for a group with parameters and no group.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      std::vector<ShardingGroup> groups, const ShardOptimizerFactory& factory,
      const gradients::DataParallelGradSyncOptions& options = {});
  // Shards `parameters` over `group` (their layouts travel to the shards) and builds the
  // optimizer over the shards. Collective: every rank calls it.
  // Errors: ShardedGradSync::Create's; kInvalidArgument when the factory returns no optimizer,
  // one outside OptimizerKind's table (LBFGS: not elementwise), or one whose param groups do
  // not hold each shard exactly once.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      std::vector<gradients::NamedParameter> parameters, c10d::ProcessGroup& group,
      const ShardOptimizerFactory& factory,
      const gradients::DataParallelGradSyncOptions& options = {});
  // The module's trainable parameters (and with init_sync its buffers from rank 0).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      torch::nn::Module& module, c10d::ProcessGroup& group, const ShardOptimizerFactory& factory,
      const gradients::DataParallelGradSyncOptions& options = {});

  // As DataParallelGradSync's: accumulation micro-batches do not communicate.
  void PrepareForGradAccumulation();
  void PrepareForFinalBackward();
  void SkipBackward();
  // ShardedGradSync::Wait of every group, all of them even when one fails (the first error
  // is returned): each shard's grad() is its group's average of its rows. Collective.
  [[nodiscard]] absl::Status Wait();

  // For ClipGradNorm between Wait and Step: the shards the optimizer steps, with their layouts
  // and gradients.
  std::vector<gradients::NamedParameter> ShardParameters() const;

  // Steps the shards with optimizer(), then all-gathers them into every rank's parameters; a
  // rank whose step throws still all-gathers, and every rank then fails. Collective.
  // Errors: kInternal when the optimizer's step throws (its peers: kAborted naming the rank);
  // ShardedGradSync::AllGather's.
  [[nodiscard]] absl::Status Step();
  // Clears the gradients of the module's parameters and of the shards (they become undefined).
  void ZeroGrad();
  // The main copies' values rounded into the parameters' rows, then all-gathered: after their
  // main copies were loaded. Nothing without main copies. Collective.
  // Errors: ShardedGradSync::AllGather's.
  [[nodiscard]] absl::Status CopyMainToModel();
  // The parameters' rows into the main copies: after the parameters were set (a reset, a
  // pretrained model). Nothing without main copies.
  void CopyModelToMain();

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // Every group's shards as the optimizer steps them (the main copies where there are),
  // in group order.
  const std::vector<gradients::ParamShard>& shards() const { return shards_; }
  // Whether the optimizer steps main copies of some shards.
  bool has_main_copies() const;
  // ShardedGradSync::LocalGradientSum over the groups: a float64 scalar.
  at::Tensor LocalGradientSum() const;
  // The elements of this rank's shards.
  int64_t shard_numel() const;

 private:
  DistributedOptimizer(std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs,
                       std::vector<gradients::ParamShard> shards,
                       std::optional<internal::MainCopies> main,
                       std::unique_ptr<torch::optim::Optimizer> optimizer);
  // The optimizer over the syncs' shards, checked.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Make(
      std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs,
      const ShardOptimizerFactory& factory);

  std::vector<std::unique_ptr<gradients::ShardedGradSync>> syncs_;
  // The syncs' shards (views of the parameters), and what the optimizer steps: the same, or
  // with main gradients float32 main copies of the narrower ones.
  std::vector<gradients::ParamShard> model_shards_;
  std::vector<gradients::ParamShard> shards_;
  std::optional<internal::MainCopies> main_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace keel::optim

#endif  // KEEL_OPTIM_DISTRIBUTED_OPTIMIZER_H_
