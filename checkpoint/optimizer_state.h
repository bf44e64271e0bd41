// An optimizer (and its learning-rate scheduler) as a Stateful, after NeMo AutoModel's
// OptimizerState (nemo_automodel/components/checkpoint/stateful_wrappers.py): the per-parameter
// state and param-group options of any optimizer of optim::OptimizerKind's table (LibTorch's
// Adam, AdamW, SGD, RMSprop, Adagrad), keyed by parameter name rather than by tensor address, so
// a checkpoint loads into a fresh process whose optimizer has no state yet; plus a
// keel::optim::ParamScheduler's state under "sched".
//
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   KEEL_ASSIGN_OR_RETURN(auto optim_state, OptimizerState::Create(*model, adamw, &scheduler));
//   KEEL_ASSIGN_OR_RETURN(auto report, LoadFromMemory({{"optim", &optim_state}}, saved, {}));
#ifndef KEEL_CHECKPOINT_OPTIMIZER_STATE_H_
#define KEEL_CHECKPOINT_OPTIMIZER_STATE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/state_dict.h"
#include "optim/data_parallel_optimizer.h"
#include "optim/distributed_optimizer.h"
#include "optim/optimizer_kind.h"
#include "optim/param_scheduler.h"
#include "parallel/layout.h"
#include "torch/nn/module.h"
#include "torch/optim/optimizer.h"

namespace keel::checkpoint {

// The optimizer's state, with parameters named by the model's first name for them
// (Module::named_parameters order):
//   tensors  "state/<param>/exp_avg", ".../exp_avg_sq", ".../max_exp_avg_sq" (Adam, AdamW;
//            the last one once amsgrad has created it), ".../momentum_buffer" (SGD with
//            momentum), ".../square_avg", ".../momentum_buffer" (momentum > 0),
//            ".../grad_avg" (centered) (RMSprop), ".../sum" (Adagrad), each with the
//            parameter's layout when it is sharded;
//   values   {"type": "Adam" | "AdamW" | "SGD" | "RMSprop" | "Adagrad",
//             "param_groups": [{"params": [<param>, ...], "lr": ..., "betas": [b1, b2],
//                               "eps": ..., "weight_decay": ..., "amsgrad": ...}],
//                  (SGD: "lr", "momentum", "dampening", "weight_decay", "nesterov";
//                   RMSprop: "lr", "alpha", "eps", "weight_decay", "momentum", "centered";
//                   Adagrad: "lr", "lr_decay", "weight_decay", "initial_accumulator_value",
//                   "eps")
//             "state": {<param>: {"step": n} (all but SGD) or {} (SGD)},
//             "sched": ParamSchedulerState fields (only with a scheduler)}.
// Only parameters the optimizer has stepped have state, as in LibTorch and PyTorch.
//
// A load replaces the options of every param group and the state of every parameter of the
// optimizer (a parameter without saved state gets none), then loads the scheduler, as
// optimizer.load_state_dict then scheduler.load_state_dict do. Differences of fit are
// recorded in the load's report and change nothing in the optimizer: another "type", another
// number of param groups, other parameter names in a group (by position), or missing option
// fields. A parameter whose saved state tensors are missing or do not fit (shape, dtype) is
// reported and gets no state. Saved "sched" values are ignored without a scheduler, as in
// NeMo.
class OptimizerState : public Stateful {
 public:
  // `layouts` gives the blocks of sharded parameters by name; their state tensors use the
  // same layout. Errors: kInvalidArgument for an optimizer outside optim::OptimizerKind's
  // table, a parameter of the optimizer that is not a parameter of `model` (naming its
  // group and position), or a layout that names no parameter of `model`.
  // Requires: `model`, `optimizer` and `scheduler` (may be null) outlive this object.
  [[nodiscard]] static absl::StatusOr<OptimizerState> Create(
      torch::nn::Module& model, torch::optim::Optimizer& optimizer,
      optim::ParamScheduler* scheduler = nullptr,
      std::map<std::string, parallel::TensorLayout> layouts = {});

  // The state of a DistributedOptimizer (its optimizer over this rank's shards), saved as the
  // unsharded optimizer's is: under each parameter's name, every state tensor with the
  // parameter's shape, of which each rank writes its shard's rows. So its checkpoints load
  // sharded on any number of ranks and unsharded alike, and the unsharded ones load sharded.
  // Errors: as above, for the shards' optimizer.
  // Requires: `optimizer` and `scheduler` (may be null) outlive this object.
  [[nodiscard]] static absl::StatusOr<OptimizerState> Create(
      optim::DistributedOptimizer& optimizer, optim::ParamScheduler* scheduler = nullptr);

  // The state of a DataParallelOptimizer, sharded or not: as the first Create for what it steps
  // (its parameters or their float32 main copies, by the parameters' names, with their
  // layouts), or as the second for its shards.
  // Errors: as above. Requires: `optimizer` and `scheduler` (may be null) outlive this object.
  [[nodiscard]] static absl::StatusOr<OptimizerState> Create(
      optim::DataParallelOptimizer& optimizer, optim::ParamScheduler* scheduler = nullptr);

  // Errors: as Create, for parameters added to the model or the optimizer since.
  [[nodiscard]] absl::StatusOr<State> StateDict() const override;
  // Errors: as StateDict; kInvalidArgument for ill-typed saved values (naming the field) or
  // what ParamScheduler::LoadStateDict rejects; those of StateReader::ReadTensor.
  [[nodiscard]] absl::Status LoadStateDict(StateReader& reader) override;

 private:
  // The tensors the optimizer steps, by name.
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

  OptimizerState(optim::OptimizerKind kind, torch::nn::Module* model, NamedTensors named,
                 torch::optim::Optimizer& optimizer, optim::ParamScheduler* scheduler,
                 std::map<std::string, parallel::TensorLayout> layouts);
  [[nodiscard]] static absl::StatusOr<OptimizerState> Make(
      torch::nn::Module* model, NamedTensors named, torch::optim::Optimizer& optimizer,
      optim::ParamScheduler* scheduler, std::map<std::string, parallel::TensorLayout> layouts);

  // The name of every parameter of every param group, by group.
  absl::StatusOr<std::vector<std::vector<std::string>>> GroupParamNames() const;

  optim::OptimizerKind kind_;
  // The model whose parameters the optimizer steps, or (null) the named tensors it steps.
  torch::nn::Module* model_;
  NamedTensors named_;
  torch::optim::Optimizer* optimizer_;
  optim::ParamScheduler* scheduler_;
  std::map<std::string, parallel::TensorLayout> layouts_;
};

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_OPTIMIZER_STATE_H_
