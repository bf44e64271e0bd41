// The optimizer of a model whose replicas train on data-parallel ranks, as Megatron-Core's
// get_megatron_optimizer assembles it (megatron/core/optimizer/__init__.py, optimizer.py,
// distrib_optimizer.py) and NeMo AutoModel's recipes use it: the gradients averaged over the
// data-parallel group (gradients::DataParallelGradSync), or with use_distributed_optimizer
// reduce-scattered to row shards whose state only their rank keeps (DistributedOptimizer);
// clipped by the norm of the whole gradient over every parameter's layout; then stepped. One
// object for a third party's loop, with the same calls whatever the mode.
//
// Megatron's mixed precision (--bf16) is options.sync.main_grad_dtype: gradients summed into
// main-gradient buffers of that dtype (float32: grad_reduce_in_fp32) on every micro-batch and
// reduced there; the optimizer steps float32 main parameters (a rank's shards of them with the
// distributed optimizer) whose gradients are the main gradients, and each step rounds their
// values into the bf16 parameters.
//
//   auto adamw = [](const std::vector<gradients::NamedParameter>& params) { ... };
//   KEEL_ASSIGN_OR_RETURN(auto optimizer,
//                         DataParallelOptimizer::Create(TrainableParameters({model}), dp, adamw));
//   optimizer->PrepareForGradAccumulation();  // micro-batches; PrepareForFinalBackward last
//   KEEL_RETURN_IF_ERROR(optimizer->Wait());
//   KEEL_ASSIGN_OR_RETURN(at::Tensor norm, optimizer->ClipGradNorm(1.0));
//   KEEL_RETURN_IF_ERROR(optimizer->Step());
#ifndef KEEL_OPTIM_DATA_PARALLEL_OPTIMIZER_H_
#define KEEL_OPTIM_DATA_PARALLEL_OPTIMIZER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "gradients/parameters.h"
#include "optim/distributed_optimizer.h"
#include "optim/internal/main_copies.h"
#include "torch/optim/optimizer.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::optim {

// Builds the LibTorch optimizer over what this rank steps: the parameters, or with the
// distributed optimizer their shards (each a NamedParameter of the parameter's name, the shard's
// tensor and layout). It must hold each given tensor exactly once; group them by name as the
// whole model's optimizer would be (no weight decay on biases, say).
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const std::vector<gradients::NamedParameter>& params)>;

struct DataParallelOptimizerOptions {
  // Megatron's use_distributed_optimizer: each rank keeps the state of its shard only (ZeRO
  // stage 1 in memory, a whole gradient buffer and no .grad beside it); nothing to shard
  // without a group. Default: false.
  bool use_distributed_optimizer = false;
  // The gradient buckets (bucket_cap_mb, init_sync, main_grad_dtype). Default:
  // DataParallelGradSync's.
  gradients::DataParallelGradSyncOptions sync;
  // The clipping norm (norm_type, the pipeline group, ...). Default: ClipGradNorm's.
  gradients::ClipGradNormOptions clip;
  // Expert parameters, those whose layout has a dimension of this name ("ep"), average their
  // gradients over `expert_data_parallel_group` instead of the data-parallel group (Megatron's
  // expert data-parallel group: the ranks holding the same experts), and with
  // use_distributed_optimizer their state is sharded over it (Create fails without it then);
  // nullptr: one rank holds them. Default: "" (no expert parameters).
  std::string expert_dim_name;
  c10d::ProcessGroup* expert_data_parallel_group = nullptr;
};

class DataParallelOptimizer {
 public:
  // The optimizer over `parameters` (their layouts travel with them), whose gradients average
  // over `group`; nullptr for one data-parallel rank (nothing to average or shard). The factory
  // must build an optim::OptimizerKind optimizer. Collective: over `group`. Errors: those of
  // DataParallelGradSync::Create or DistributedOptimizer::Create; kInvalidArgument for a
  // factory that returns no optimizer, one outside OptimizerKind's table, or one that does not
  // hold each given tensor once.
  // Requires: the parameters' tensors and `group` outlive this object.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallelOptimizer>> Create(
      std::vector<gradients::NamedParameter> parameters, c10d::ProcessGroup* group,
      const OptimizerFactory& factory, const DataParallelOptimizerOptions& options = {});

  // As DataParallelGradSync's (nothing without a group).
  void PrepareForGradAccumulation();
  void PrepareForFinalBackward();
  void SkipBackward();
  [[nodiscard]] absl::Status Wait();
  // What this rank steps: the parameters, or with the distributed optimizer their shards, each
  // with its layout; with main gradients, the float32 main copies of narrower parameters (or
  // shards), whose gradients are the averaged main gradients after Wait.
  std::vector<gradients::NamedParameter> StepParameters() const;
  // gradients::ScaleGradsAndClipGradNorm over StepParameters(), with their layouts: the
  // gradients scaled as `scaling` says (by default not at all), then clipped by the norm of the
  // whole gradient. Collective: over the layouts' groups and options.clip.pp_group.
  [[nodiscard]] absl::StatusOr<at::Tensor> ClipGradNorm(
      std::optional<double> max_norm, const gradients::GradScalingOptions& scaling = {});
  // The step (then, sharded, the all-gather of the shards), and the gradients cleared.
  // Collective. Errors: kInternal when the step throws; DistributedOptimizer::Step's.
  [[nodiscard]] absl::Status Step();
  // The gradients cleared without a step: the step is dropped (every rank must drop it).
  void SkipStep();
  // Whether the optimizer steps float32 main copies of (some) parameters.
  bool has_main_copies() const;
  // The main copies' values, rounded, into the parameters (all-gathered when sharded): after
  // the main copies were loaded from a checkpoint. Nothing without main copies. Collective
  // when sharded. Errors: kInternal when a copy fails; DistributedOptimizer's.
  [[nodiscard]] absl::Status CopyMainToModel();
  // The parameters' values into their main copies (Megatron's reload_model_params): after the
  // parameters were set otherwise. Nothing without main copies.
  void CopyModelToMain();
  // The sum of this rank's gradients before the reduction, after Wait (see
  // DataParallelGradSync::LocalGradientSum); without a group, of its gradients as they are (a
  // float64 pass over them: for diagnostics, not every step). Undefined without gradients.
  at::Tensor LocalGradientSum() const;
  // Back to the state Create made: no optimizer state, every param group's options as built,
  // the main copies taken from the parameters again.
  void Reset();

  // The LibTorch optimizer, whose options a ParamScheduler sets.
  torch::optim::Optimizer& optimizer();
  // The parameters as given.
  const std::vector<gradients::NamedParameter>& parameters() const { return parameters_; }
  // The distributed optimizer, when the state is sharded; else nullptr.
  DistributedOptimizer* sharded() { return sharded_.get(); }
  // "AdamW", or "AdamW sharded over the data-parallel ranks[, experts over the expert
  // data-parallel ones] (E of N parameters' state here)".
  std::string Describe() const;

 private:
  DataParallelOptimizer(std::vector<gradients::NamedParameter> parameters,
                        const DataParallelOptimizerOptions& options);

  std::vector<gradients::NamedParameter> parameters_;
  DataParallelOptimizerOptions options_;
  // Unsharded: the optimizer over the parameters (or their main copies), and the sync with a
  // group (with main gradients, without one too).
  std::unique_ptr<torch::optim::Optimizer> whole_;
  std::unique_ptr<gradients::DataParallelGradSync> sync_;
  // Unsharded, with expert parameters and their group (or main gradients): their sync.
  std::unique_ptr<gradients::DataParallelGradSync> expert_sync_;
  // Unsharded, with main gradients: what the optimizer steps for each parameter, and its main
  // gradient.
  std::optional<internal::MainCopies> main_;
  std::vector<at::Tensor> main_grads_;
  // Sharded.
  std::unique_ptr<DistributedOptimizer> sharded_;
  // Each param group's options as built, for Reset.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> initial_options_;
};

}  // namespace keel::optim

#endif  // KEEL_OPTIM_DATA_PARALLEL_OPTIMIZER_H_
