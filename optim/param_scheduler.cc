#include "optim/param_scheduler.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::optim {
namespace {

// Python's math.pi.
constexpr double kPi = 3.141592653589793;

constexpr base::EnumSpelling<LrDecayStyle> kLrDecayStyles[] = {
    {LrDecayStyle::kConstant, "constant"},
    {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kCosine, "cosine"},
    {LrDecayStyle::kInverseSquareRoot, "inverse-square-root"},
    {LrDecayStyle::kWsd, "WSD"},
};
constexpr base::EnumSpelling<WdIncrStyle> kWdIncrStyles[] = {
    {WdIncrStyle::kConstant, "constant"},
    {WdIncrStyle::kLinear, "linear"},
    {WdIncrStyle::kCosine, "cosine"},
};
constexpr base::EnumSpelling<SchedulerLoadPolicy> kSchedulerLoadPolicies[] = {
    {SchedulerLoadPolicy::kReference, "reference"},
    {SchedulerLoadPolicy::kCorrected, "corrected"},
};
constexpr base::EnumSpelling<LrWsdDecayStyle> kLrWsdDecayStyles[] = {
    {LrWsdDecayStyle::kLinear, "linear"},
    {LrWsdDecayStyle::kCosine, "cosine"},
    {LrWsdDecayStyle::kExponential, "exponential"},
    {LrWsdDecayStyle::kMinusSqrt, "minus_sqrt"},
};

// Megatron's _check_and_set: the value LoadStateDict adopts for one field.
template <typename T>
absl::StatusOr<T> CheckAndSet(const ParamSchedulerOptions& options, absl::string_view name,
                              const T& class_value, const T& checkpoint_value) {
  if (options.override_opt_param_scheduler) return class_value;
  if (!options.use_checkpoint_opt_param_scheduler && !(class_value == checkpoint_value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_state_dict: ", name, " is ", base::ToJson(class_value).dump(),
        " in the scheduler but ", base::ToJson(checkpoint_value).dump(),
        " in the checkpoint; set use_checkpoint_opt_param_scheduler to take the checkpoint's "
        "value or override_opt_param_scheduler to keep the scheduler's"));
  }
  return checkpoint_value;
}

}  // namespace

bool AbslParseFlag(absl::string_view text, LrDecayStyle* out, std::string* error) {
  return base::ParseEnum(kLrDecayStyles, text, out, error);
}
bool AbslParseFlag(absl::string_view text, WdIncrStyle* out, std::string* error) {
  return base::ParseEnum(kWdIncrStyles, text, out, error);
}
bool AbslParseFlag(absl::string_view text, LrWsdDecayStyle* out, std::string* error) {
  return base::ParseEnum(kLrWsdDecayStyles, text, out, error);
}
bool AbslParseFlag(absl::string_view text, SchedulerLoadPolicy* out, std::string* error) {
  return base::ParseEnum(kSchedulerLoadPolicies, text, out, error);
}
std::string AbslUnparseFlag(LrDecayStyle style) {
  return std::string(base::EnumName(kLrDecayStyles, style));
}
std::string AbslUnparseFlag(WdIncrStyle style) {
  return std::string(base::EnumName(kWdIncrStyles, style));
}
std::string AbslUnparseFlag(LrWsdDecayStyle style) {
  return std::string(base::EnumName(kLrWsdDecayStyles, style));
}
std::string AbslUnparseFlag(SchedulerLoadPolicy policy) {
  return std::string(base::EnumName(kSchedulerLoadPolicies, policy));
}

absl::Status Validate(const ParamSchedulerOptions& o) {
  // Megatron's assertions, in its order, written as they are so that NaN fails them too.
  if (!(o.min_lr >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("min_lr (", o.min_lr, ") must be >= 0"));
  }
  if (!(o.max_lr >= o.min_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_lr (", o.max_lr, ") must be >= min_lr (", o.min_lr, ")"));
  }
  if (!(o.init_lr <= o.max_lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("init_lr (", o.init_lr, ") must be <= max_lr (", o.max_lr, ")"));
  }
  if (!(o.lr_decay_steps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr_decay_steps (", o.lr_decay_steps, ") must be > 0"));
  }
  if (!(o.lr_warmup_steps < o.lr_decay_steps)) {
    return absl::InvalidArgumentError(absl::StrCat("lr_warmup_steps (", o.lr_warmup_steps,
                                                   ") must be < lr_decay_steps (", o.lr_decay_steps,
                                                   ")"));
  }
  if (o.lr_decay_style == LrDecayStyle::kWsd) {
    // Megatron asserts wsd_decay_steps here and fails on a missing lr_wsd_decay_style only
    // once the anneal phase is reached.
    if (!o.wsd_decay_steps.has_value()) {
      return absl::InvalidArgumentError(
          "wsd_decay_steps is required when lr_decay_style is \"WSD\"");
    }
    if (!o.lr_wsd_decay_style.has_value()) {
      return absl::InvalidArgumentError(
          "lr_wsd_decay_style is required when lr_decay_style is \"WSD\" (one of \"linear\", "
          "\"cosine\", \"exponential\", \"minus_sqrt\")");
    }
  }
  if (!(o.start_wd >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat("start_wd (", o.start_wd, ") must be >= 0"));
  }
  if (!(o.end_wd >= o.start_wd)) {
    return absl::InvalidArgumentError(
        absl::StrCat("end_wd (", o.end_wd, ") must be >= start_wd (", o.start_wd, ")"));
  }
  if (o.override_opt_param_scheduler && o.use_checkpoint_opt_param_scheduler) {
    return absl::InvalidArgumentError(
        "both override_opt_param_scheduler and use_checkpoint_opt_param_scheduler are set; "
        "choose at most one");
  }
  // Megatron fails on these only when get_wd reaches them (a ZeroDivisionError at step 0).
  if (o.wd_incr_style != WdIncrStyle::kConstant && o.wd_incr_steps == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("wd_incr_steps (0) must be non-zero when "
                     "wd_incr_style is \"",
                     AbslUnparseFlag(o.wd_incr_style), "\""));
  }
  return Validate(o, ParamGroupOverrides{});
}

absl::Status Validate(const ParamSchedulerOptions& o, const ParamGroupOverrides& group) {
  const double start_wd = group.start_wd.value_or(o.start_wd);
  const double end_wd = group.end_wd.value_or(o.end_wd);
  if (o.wd_incr_style == WdIncrStyle::kConstant && !(start_wd == end_wd)) {
    return absl::InvalidArgumentError(absl::StrCat("start_wd (", start_wd, ") must equal end_wd (",
                                                   end_wd, ") when wd_incr_style is \"constant\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParamScheduler> ParamScheduler::Create(
    const ParamSchedulerOptions& options, torch::optim::Optimizer& optimizer,
    std::vector<ParamGroupOverrides> group_overrides) {
  KEEL_RETURN_IF_ERROR(Validate(options));
  if (group_overrides.size() > optimizer.param_groups().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_overrides has ", group_overrides.size(), " entries but the optimizer has ",
        optimizer.param_groups().size(), " param groups"));
  }
  for (size_t i = 0; i < group_overrides.size(); ++i) {
    absl::Status status = Validate(options, group_overrides[i]);
    if (!status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("param group ", i, ": ", status.message()));
    }
  }
  return ParamScheduler(options, optimizer, std::move(group_overrides));
}

ParamScheduler::ParamScheduler(const ParamSchedulerOptions& options,
                               torch::optim::Optimizer& optimizer,
                               std::vector<ParamGroupOverrides> group_overrides)
    : options_(options),
      optimizer_(&optimizer),
      // An optimizer outside optim::OptimizerKind's table gets learning rates only.
      kind_([&]() -> std::optional<OptimizerKind> {
        absl::StatusOr<OptimizerKind> kind = KindOf(optimizer);
        if (!kind.ok()) return std::nullopt;
        return *kind;
      }()),
      group_overrides_(std::move(group_overrides)) {
  Advance(0);
}

double ParamScheduler::GetLr(const ParamGroupOverrides& group) const {
  // Each expression keeps Megatron's operand order so that results are bit-identical.
  const ParamSchedulerOptions& o = options_;
  const double max_lr = group.max_lr.value_or(o.max_lr);
  const double min_lr = group.min_lr.value_or(o.min_lr);
  const int64_t n = num_steps_;

  if (o.lr_warmup_steps > 0 && n <= o.lr_warmup_steps) {
    return o.init_lr +
           ((max_lr - o.init_lr) * static_cast<double>(n) / static_cast<double>(o.lr_warmup_steps));
  }
  if (o.lr_decay_style == LrDecayStyle::kConstant) return max_lr;
  if (n > o.lr_decay_steps) return min_lr;

  if (o.lr_decay_style == LrDecayStyle::kInverseSquareRoot) {
    // Python's int ** 0.5 is C pow(), not sqrt().
    const double warmup_steps = static_cast<double>(std::max<int64_t>(o.lr_warmup_steps, 1));
    const double num_steps = static_cast<double>(std::max<int64_t>(n, 1));
    const double lr = max_lr * std::pow(warmup_steps, 0.5) / std::pow(num_steps, 0.5);
    return lr > min_lr ? lr : min_lr;  // Python's max(min_lr, lr)
  }

  const double decay_ratio = static_cast<double>(n - o.lr_warmup_steps) /
                             static_cast<double>(o.lr_decay_steps - o.lr_warmup_steps);
  const double delta_lr = max_lr - min_lr;
  double coeff = 1.0;
  switch (o.lr_decay_style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - decay_ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(kPi * decay_ratio) + 1.0);
      break;
    case LrDecayStyle::kWsd: {
      const int64_t wsd_decay_steps = *o.wsd_decay_steps;
      const int64_t anneal_start = o.lr_decay_steps - wsd_decay_steps;
      if (n <= anneal_start) break;
      const double wsd_ratio =
          static_cast<double>(n - anneal_start) / static_cast<double>(wsd_decay_steps);
      switch (*o.lr_wsd_decay_style) {
        case LrWsdDecayStyle::kLinear:
          coeff = 1.0 - wsd_ratio;
          break;
        case LrWsdDecayStyle::kCosine:
          coeff = 0.5 * (std::cos(kPi * wsd_ratio) + 1.0);
          break;
        case LrWsdDecayStyle::kExponential:
          coeff = (2.0 * std::pow(0.5, wsd_ratio)) - 1.0;
          break;
        case LrWsdDecayStyle::kMinusSqrt:
          coeff = 1.0 - std::sqrt(wsd_ratio);
          break;
      }
      break;
    }
    case LrDecayStyle::kConstant:
    case LrDecayStyle::kInverseSquareRoot:
      break;  // returned above
  }
  return min_lr + coeff * delta_lr;
}

double ParamScheduler::GetWd(const ParamGroupOverrides& group) const {
  const ParamSchedulerOptions& o = options_;
  const double start_wd = group.start_wd.value_or(o.start_wd);
  const double end_wd = group.end_wd.value_or(o.end_wd);
  if (num_steps_ > o.wd_incr_steps) return end_wd;
  if (o.wd_incr_style == WdIncrStyle::kConstant) return end_wd;

  const double incr_ratio = static_cast<double>(num_steps_) / static_cast<double>(o.wd_incr_steps);
  const double delta_wd = end_wd - start_wd;
  const double coeff = o.wd_incr_style == WdIncrStyle::kLinear
                           ? incr_ratio
                           : 0.5 * (std::cos(kPi * (1 - incr_ratio)) + 1.0);
  return start_wd + coeff * delta_wd;
}

absl::Status ParamScheduler::Step(int64_t increment) {
  if (increment < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParamScheduler::Step: increment (", increment, ") must be >= 0"));
  }
  Advance(increment);
  return absl::OkStatus();
}

void ParamScheduler::Advance(int64_t increment) {
  num_steps_ += increment;
  static const ParamGroupOverrides kNoOverrides;
  std::vector<torch::optim::OptimizerParamGroup>& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroupOverrides& group =
        i < group_overrides_.size() ? group_overrides_[i] : kNoOverrides;
    groups[i].options().set_lr(GetLr(group) * group.lr_mult);
    if (kind_) SetWeightDecay(*kind_, groups[i].options(), GetWd(group) * group.wd_mult);
  }
}

ParamSchedulerState ParamScheduler::StateDict() const {
  ParamSchedulerState state;
  state.max_lr = options_.max_lr;
  state.lr_warmup_steps = options_.lr_warmup_steps;
  state.num_steps = num_steps_;
  state.lr_decay_style = options_.lr_decay_style;
  state.lr_decay_steps = options_.lr_decay_steps;
  state.min_lr = options_.min_lr;
  state.start_wd = options_.start_wd;
  state.end_wd = options_.end_wd;
  state.wd_incr_style = options_.wd_incr_style;
  state.wd_incr_steps = options_.wd_incr_steps;
  return state;
}

absl::Status ParamScheduler::LoadStateDict(const ParamSchedulerState& state) {
  ParamSchedulerOptions lr_loaded = options_;
  KEEL_ASSIGN_OR_RETURN(lr_loaded.max_lr,
                        CheckAndSet(options_, "max_lr", options_.max_lr, state.max_lr));
  KEEL_ASSIGN_OR_RETURN(lr_loaded.min_lr,
                        CheckAndSet(options_, "min_lr", options_.min_lr, state.min_lr));
  KEEL_ASSIGN_OR_RETURN(
      lr_loaded.lr_warmup_steps,
      CheckAndSet(options_, "lr_warmup_steps", options_.lr_warmup_steps, state.lr_warmup_steps));
  KEEL_ASSIGN_OR_RETURN(
      lr_loaded.lr_decay_steps,
      CheckAndSet(options_, "lr_decay_steps", options_.lr_decay_steps, state.lr_decay_steps));
  KEEL_ASSIGN_OR_RETURN(
      lr_loaded.lr_decay_style,
      CheckAndSet(options_, "lr_decay_style", options_.lr_decay_style, state.lr_decay_style));
  if (state.num_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("load_state_dict: num_steps (", state.num_steps, ") must be >= 0"));
  }

  ParamSchedulerOptions all_loaded = lr_loaded;
  const int present = state.start_wd.has_value() + state.end_wd.has_value() +
                      state.wd_incr_style.has_value() + state.wd_incr_steps.has_value();
  if (present != 0 && present != 4) {
    return absl::InvalidArgumentError(
        "load_state_dict: start_wd, end_wd, wd_incr_style and wd_incr_steps must be all "
        "present or all absent");
  }
  if (present == 4) {
    KEEL_ASSIGN_OR_RETURN(all_loaded.start_wd,
                          CheckAndSet(options_, "start_wd", options_.start_wd, *state.start_wd));
    KEEL_ASSIGN_OR_RETURN(all_loaded.end_wd,
                          CheckAndSet(options_, "end_wd", options_.end_wd, *state.end_wd));
    KEEL_ASSIGN_OR_RETURN(
        all_loaded.wd_incr_steps,
        CheckAndSet(options_, "wd_incr_steps", options_.wd_incr_steps, *state.wd_incr_steps));
    KEEL_ASSIGN_OR_RETURN(
        all_loaded.wd_incr_style,
        CheckAndSet(options_, "wd_incr_style", options_.wd_incr_style, *state.wd_incr_style));
  }
  // Both the schedule used by the Step below and the final one must be valid.
  for (const ParamSchedulerOptions* candidate : {&lr_loaded, &all_loaded}) {
    absl::Status status = Validate(*candidate);
    for (size_t i = 0; status.ok() && i < group_overrides_.size(); ++i) {
      status = Validate(*candidate, group_overrides_[i]);
    }
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("load_state_dict: the loaded schedule is invalid: ", status.message()));
    }
  }

  const bool reference = options_.load_policy == SchedulerLoadPolicy::kReference;
  if (!reference) num_steps_ = 0;
  options_ = reference ? lr_loaded : all_loaded;
  Advance(state.num_steps);
  options_ = all_loaded;
  return absl::OkStatus();
}

}  // namespace keel::optim
