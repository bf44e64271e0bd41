#ifndef KEEL_TOOLS_RECIPE_LR_SCHEDULE_H_
#define KEEL_TOOLS_RECIPE_LR_SCHEDULE_H_

// The trainer's learning-rate and weight-decay schedule, with the defaults of NeMo AutoModel's
// LRSchedulerConfig.build: a field lr_scheduler leaves unset comes from the optimizer
// (ReadLrScheduler: max_lr = optimizer.lr, Megatron's --lr; init_lr 0.1 x lr; min_lr
// 0.01 x lr; start_wd and end_wd = optimizer.weight_decay; lr_decay_style cosine) or from the run's
// length once its data is known (LrSchedule: lr_decay_steps and wd_incr_steps the run's steps,
// lr_warmup_steps min(1000, steps / 10)). Beside it, the run's length it derives from
// (TotalSteps, CheckStepsLeft).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "optim/param_scheduler.h"
#include "tools/recipe/config.pb.h"

namespace keel::tools::recipe {

// The lr_scheduler step counts a configuration leaves unset, which LrSchedule derives.
struct DerivedLrSteps {
  bool lr_warmup_steps = false;
  bool lr_decay_steps = false;
  bool wd_incr_steps = false;
};

// Copies `config` over `schedule`, fills the unset values from the optimizer's `lr` and
// `weight_decay` and marks the unset step counts in `derived`. Errors: kInvalidArgument naming
// a bad lr_decay_style, wd_incr_style, lr_wsd_decay_style or load_policy spelling.
[[nodiscard]] absl::Status ReadLrScheduler(const LrSchedulerConfig& config, double lr,
                                           double weight_decay,
                                           optim::ParamSchedulerOptions& schedule,
                                           DerivedLrSteps& derived);

// AutoModel's total steps of a run: max_steps, or num_epochs x epoch_len when that is fewer.
[[nodiscard]] int64_t TotalSteps(int64_t max_steps, std::optional<int64_t> epoch_len,
                                 int64_t num_epochs);

// Whether a run that starts at step `start_step` of epoch `start_epoch` (step_scheduler's
// start_step and start_epoch) has a step to train before max_steps and num_epochs end it. Errors:
// kInvalidArgument naming the start and the end it reaches.
[[nodiscard]] absl::Status CheckStepsLeft(int64_t start_step, int64_t start_epoch,
                                          int64_t max_steps, int64_t num_epochs);

// The schedule of a run of `total_steps` optimizer steps (the fewer of max_steps and its epochs'
// steps): `schedule` with the step counts marked in `derived` derived.
[[nodiscard]] optim::ParamSchedulerOptions LrSchedule(optim::ParamSchedulerOptions schedule,
                                                      const DerivedLrSteps& derived,
                                                      int64_t total_steps);

// What a user would want to hear before a run on `schedule` of `total_steps` steps: a peak
// learning rate of 0 (nothing learns) and a warm-up that outlasts the run. One line each.
[[nodiscard]] std::vector<std::string> LrScheduleWarnings(
    const optim::ParamSchedulerOptions& schedule, int64_t total_steps);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_LR_SCHEDULE_H_
