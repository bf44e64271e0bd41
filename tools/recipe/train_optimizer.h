// The run's optimizer and data-parallel gradient path: AdamW over the whole parameters with
// gradients::DataParallelGradSync (every rank holds all of AdamW's state), or, with
// distributed.use_distributed_optimizer on several ranks, optim::DistributedOptimizer (each
// rank holds its shard's). Both save the same checkpoint keys, so a run may switch between
// them, or change its number of ranks, at a resume.
//
//   KEEL_ASSIGN_OR_RETURN(auto optimizer, TrainOptimizer::Create(options, *model, group));
//   optimizer->PrepareForGradAccumulation();  // ... backward passes ...
//   KEEL_RETURN_IF_ERROR(optimizer->Wait());
//   KEEL_ASSIGN_OR_RETURN(at::Tensor norm, optimizer->ClipGradNorm(options.max_norm));
//   KEEL_RETURN_IF_ERROR(optimizer->Step());
#ifndef KEEL_TOOLS_RECIPE_TRAIN_OPTIMIZER_H_
#define KEEL_TOOLS_RECIPE_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/optimizer_state.h"
#include "gradients/dp_sync.h"
#include "optim/distributed_optimizer.h"
#include "optim/param_scheduler.h"
#include "tools/recipe/options.h"
#include "torch/nn/module.h"
#include "torch/optim/adamw.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::tools::recipe {

class TrainOptimizer {
 public:
  // `group` is the data-parallel group, nullptr on one rank (nothing to synchronise or
  // shard). Collective over `group`. Errors: those of DataParallelGradSync::Create or
  // DistributedOptimizer::Create.
  // Requires: `model` and `group` outlive this object.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TrainOptimizer>> Create(
      const TrainOptions& options, torch::nn::Module& model, c10d::ProcessGroup* group);

  // As DataParallelGradSync's (nothing on one rank).
  void PrepareForGradAccumulation();
  void PrepareForFinalBackward();
  [[nodiscard]] absl::Status Wait();
  // gradients::ClipGradNorm over the gradients this rank steps (with their sharding); the
  // norm is the whole gradient's. Collective.
  [[nodiscard]] absl::StatusOr<at::Tensor> ClipGradNorm(std::optional<double> max_norm);
  // The AdamW step (then the all-gather of the shards), and gradients cleared. Collective.
  [[nodiscard]] absl::Status Step();
  // Gradients cleared without a step: the step is dropped (every rank must drop it).
  void SkipStep();
  // The sum of this rank's gradients before the reduction, after Wait
  // (DataParallelGradSync::LocalGradientSum); undefined on one rank.
  at::Tensor LocalGradientSum() const;

  // The optimizer whose options the LR schedule sets.
  torch::optim::Optimizer& optimizer();
  // The checkpoint object of the optimizer and `scheduler`.
  [[nodiscard]] absl::StatusOr<checkpoint::OptimizerState> CheckpointState(
      optim::ParamScheduler* scheduler);
  // Back to a fresh optimizer: no state, the configured options.
  void Reset();
  // "AdamW" or "AdamW sharded over N ranks (E of its state's elements here)", for the log.
  std::string Describe() const;

 private:
  TrainOptimizer(const TrainOptions& options, torch::nn::Module& model);

  OptimizerOptions options_;
  torch::nn::Module* model_;
  // Unsharded: AdamW over the whole parameters, and the sync on several ranks.
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::unique_ptr<gradients::DataParallelGradSync> dp_sync_;
  // Sharded.
  std::unique_ptr<optim::DistributedOptimizer> sharded_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TRAIN_OPTIMIZER_H_
