#include "tools/recipe/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "tools/recipe/config.h"

namespace keel::tools::recipe {

absl::Status ReadLrScheduler(const LrSchedulerConfig& config, double lr, double weight_decay,
                             optim::ParamSchedulerOptions& schedule, DerivedLrSteps& derived) {
  KEEL_RETURN_IF_ERROR(CopyFields(config, schedule));
  if (!config.has_init_lr()) schedule.init_lr = lr * 0.1;
  if (!config.has_max_lr()) schedule.max_lr = lr;
  if (!config.has_min_lr()) schedule.min_lr = lr * 0.01;
  if (!config.has_lr_decay_style()) schedule.lr_decay_style = optim::LrDecayStyle::kCosine;
  if (!config.has_start_wd()) schedule.start_wd = weight_decay;
  if (!config.has_end_wd()) schedule.end_wd = weight_decay;
  derived = {.lr_warmup_steps = !config.has_lr_warmup_steps(),
             .lr_decay_steps = !config.has_lr_decay_steps(),
             .wd_incr_steps = !config.has_wd_incr_steps()};
  // Megatron's checks (optim::Validate) order the rates and decays; an infinite one passes them
  // and trains nothing.
  for (const auto& [field, value] :
       {std::pair{"init_lr", schedule.init_lr}, {"max_lr", schedule.max_lr},
        {"min_lr", schedule.min_lr}, {"start_wd", schedule.start_wd}, {"end_wd", schedule.end_wd}}) {
    if (!std::isinf(value)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("lr_scheduler.", field, " (", value, ") must be finite"));
  }
  return absl::OkStatus();
}

int64_t TotalSteps(int64_t max_steps, std::optional<int64_t> epoch_len, int64_t num_epochs) {
  return epoch_len.has_value() ? std::min(max_steps, num_epochs * *epoch_len) : max_steps;
}

absl::Status CheckStepsLeft(int64_t start_step, int64_t start_epoch, int64_t max_steps,
                            int64_t num_epochs) {
  const auto refuse = [](absl::string_view field, int64_t start, absl::string_view end) {
    return absl::InvalidArgumentError(absl::StrCat("step_scheduler.", field, " (", start,
                                                   ") leaves no step to train: the run ends ", end,
                                                   "; allowed: a ", field, " below it"));
  };
  if (start_step >= max_steps) {
    return refuse("start_step", start_step, absl::StrCat("at max_steps (", max_steps, ")"));
  }
  if (start_epoch >= num_epochs) {
    return refuse("start_epoch", start_epoch, absl::StrCat("after num_epochs (", num_epochs, ")"));
  }
  return absl::OkStatus();
}

optim::ParamSchedulerOptions LrSchedule(optim::ParamSchedulerOptions schedule,
                                        const DerivedLrSteps& derived, int64_t total_steps) {
  if (derived.lr_warmup_steps) schedule.lr_warmup_steps = std::min<int64_t>(1000, total_steps / 10);
  if (derived.lr_decay_steps) schedule.lr_decay_steps = total_steps;
  if (derived.wd_incr_steps) schedule.wd_incr_steps = total_steps;
  return schedule;
}

std::vector<std::string> LrScheduleWarnings(const optim::ParamSchedulerOptions& schedule,
                                            int64_t total_steps) {
  std::vector<std::string> warnings;
  if (schedule.max_lr == 0) {
    warnings.push_back(
        "the peak learning rate is 0 (lr_scheduler.max_lr, or optimizer.lr when max_lr is "
        "unset): the weights never change");
  }
  if (schedule.lr_warmup_steps > 0 && schedule.lr_warmup_steps >= total_steps) {
    warnings.push_back(absl::StrCat("lr_scheduler.lr_warmup_steps (", schedule.lr_warmup_steps,
                                    ") outlasts the run's ", total_steps,
                                    " steps: the learning rate never reaches lr_scheduler.max_lr (",
                                    schedule.max_lr, ")"));
  }
  return warnings;
}

}  // namespace keel::tools::recipe
