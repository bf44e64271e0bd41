// Megatron OptimizerParamScheduler state dicts as JSON (for the golden cases and the parity
// tool), including the legacy keys older Megatron checkpoints carry, to and from Keel's
// ParamSchedulerState.
//
//   KEEL_ASSIGN_OR_RETURN(ParamSchedulerState state, ParamSchedulerStateFromJson(dict));
//   KEEL_RETURN_IF_ERROR(scheduler.LoadStateDict(state));
#ifndef KEEL_OPTIM_INTERNAL_PARAM_SCHEDULER_JSON_H_
#define KEEL_OPTIM_INTERNAL_PARAM_SCHEDULER_JSON_H_

#include "absl/status/statusor.h"
#include "base/json.h"
#include "optim/param_scheduler.h"

namespace keel::optim::internal {

// Reads a state dict as Megatron's load_state_dict does. A legacy key wins over the current
// one when both are present: start_lr (max_lr), warmup_iter then warmup_steps
// (lr_warmup_steps), end_iter then decay_steps (lr_decay_steps), decay_style
// (lr_decay_style), num_iters (num_steps). The weight-decay fields are read only if
// start_wd is present. Errors: kInvalidArgument naming a missing key or a bad value.
[[nodiscard]] absl::StatusOr<ParamSchedulerState> ParamSchedulerStateFromJson(
    const base::Json& state_dict);

// The state dict Megatron's state_dict() returns, with its key order.
base::Json ParamSchedulerStateToJson(const ParamSchedulerState& state);

}  // namespace keel::optim::internal

#endif  // KEEL_OPTIM_INTERNAL_PARAM_SCHEDULER_JSON_H_
