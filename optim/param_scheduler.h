// Learning-rate and weight-decay schedules for a torch::optim::Optimizer, value for value
// with Megatron-Core's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py).
//
//   keel::optim::ParamSchedulerOptions options;
//   options.max_lr = 3e-4;
//   options.lr_warmup_steps = 100;
//   options.lr_decay_steps = 10000;
//   options.lr_decay_style = keel::optim::LrDecayStyle::kCosine;
//   KEEL_ASSIGN_OR_RETURN(auto scheduler, ParamScheduler::Create(options, optimizer));
//   KEEL_RETURN_IF_ERROR(scheduler.Step(1));  // after every optimizer.step()
#ifndef KEEL_OPTIM_PARAM_SCHEDULER_H_
#define KEEL_OPTIM_PARAM_SCHEDULER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "optim/optimizer_kind.h"
#include "torch/optim/optimizer.h"

namespace keel::optim {

// Megatron's lr_decay_style spellings: "constant", "linear", "cosine",
// "inverse-square-root", "WSD".
enum class LrDecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot, kWsd };
// Megatron's wd_incr_style spellings: "constant", "linear", "cosine".
enum class WdIncrStyle { kConstant, kLinear, kCosine };
// Megatron's lr_wsd_decay_style spellings: "linear", "cosine", "exponential", "minus_sqrt".
enum class LrWsdDecayStyle { kLinear, kCosine, kExponential, kMinusSqrt };
// How ParamScheduler::LoadStateDict restores a checkpoint, spelled "reference" or "corrected":
// - kReference: Megatron-Core's released load_state_dict, quirks included: the checkpoint's
//   num_steps is *added* to the steps taken (Step(num_steps)), and the weight-decay fields are
//   restored after that Step, so the groups' weight decay takes them only at the next Step.
// - kCorrected: every field is restored first, then the scheduler lands on the checkpoint's
//   step and sets the groups from the restored schedule (Megatron-LM's dev branch PR #5213,
//   proposed for main in PR #7468; NeMo AutoModel PR #3883).
// The two agree when loading into a fresh scheduler whose weight-decay fields equal the
// checkpoint's (an unchanged resume).
enum class SchedulerLoadPolicy { kReference, kCorrected };

// Parse an exact reference spelling (false and an error listing the spellings otherwise) or
// give it back. These are Abseil's flag hooks, so the enums also work as absl flags.
bool AbslParseFlag(absl::string_view text, LrDecayStyle* out, std::string* error);
bool AbslParseFlag(absl::string_view text, WdIncrStyle* out, std::string* error);
bool AbslParseFlag(absl::string_view text, LrWsdDecayStyle* out, std::string* error);
bool AbslParseFlag(absl::string_view text, SchedulerLoadPolicy* out, std::string* error);
std::string AbslUnparseFlag(LrDecayStyle style);
std::string AbslUnparseFlag(WdIncrStyle style);
std::string AbslUnparseFlag(LrWsdDecayStyle style);
std::string AbslUnparseFlag(SchedulerLoadPolicy policy);

// Mirrors the OptimizerParamScheduler constructor: same names, order and defaults. Megatron
// gives the first eleven no default; here they are value-initialized and Create() checks them.
// load_policy is Keel's (Megatron's semantics are kReference).
struct ParamSchedulerOptions {
  // Learning rate at step 0; warmup rises linearly from it. Default: 0.
  double init_lr = 0.0;
  // Learning rate at the end of warmup. Default: 0.
  double max_lr = 0.0;
  // Learning rate after lr_decay_steps. Default: 0.
  double min_lr = 0.0;
  // Steps of linear warmup from init_lr to max_lr. Default: 0.
  int64_t lr_warmup_steps = 0;
  // Step at which decay reaches min_lr; must exceed lr_warmup_steps. Default: 0.
  int64_t lr_decay_steps = 0;
  // Shape of the decay after warmup. Default: kConstant.
  LrDecayStyle lr_decay_style = LrDecayStyle::kConstant;
  // Weight decay at step 0. Default: 0.
  double start_wd = 0.0;
  // Weight decay from wd_incr_steps on. Default: 0.
  double end_wd = 0.0;
  // Steps over which weight decay moves from start_wd to end_wd. Default: 0.
  int64_t wd_incr_steps = 0;
  // Shape of the weight-decay increase. Default: kConstant.
  WdIncrStyle wd_incr_style = WdIncrStyle::kConstant;
  // LoadStateDict takes the checkpoint's values instead of requiring them equal. Default: true.
  bool use_checkpoint_opt_param_scheduler = true;
  // LoadStateDict keeps these options' values (except num_steps). Default: false.
  bool override_opt_param_scheduler = false;
  // Length of WSD's final anneal phase; required for kWsd. Default: nullopt.
  std::optional<int64_t> wsd_decay_steps;
  // Shape of WSD's anneal; required for kWsd. Default: nullopt.
  std::optional<LrWsdDecayStyle> lr_wsd_decay_style;
  // How LoadStateDict restores a checkpoint. Default: kReference (golden-tested against
  // Megatron). //tools:train defaults to kCorrected, as NeMo AutoModel's scheduler does: see
  // TrainOptions::lr_scheduler in tools/recipe/options.h.
  SchedulerLoadPolicy load_policy = SchedulerLoadPolicy::kReference;
};

// The option fields by their Megatron names, in declaration order, for every reader and
// writer of options (configs, parity inputs, printing).
template <typename O, typename V, base::IsFieldsOf<O, ParamSchedulerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("init_lr", o.init_lr);
  v("max_lr", o.max_lr);
  v("min_lr", o.min_lr);
  v("lr_warmup_steps", o.lr_warmup_steps);
  v("lr_decay_steps", o.lr_decay_steps);
  v("lr_decay_style", o.lr_decay_style);
  v("start_wd", o.start_wd);
  v("end_wd", o.end_wd);
  v("wd_incr_steps", o.wd_incr_steps);
  v("wd_incr_style", o.wd_incr_style);
  v("use_checkpoint_opt_param_scheduler", o.use_checkpoint_opt_param_scheduler);
  v("override_opt_param_scheduler", o.override_opt_param_scheduler);
  v("wsd_decay_steps", o.wsd_decay_steps);
  v("lr_wsd_decay_style", o.lr_wsd_decay_style);
  v("load_policy", o.load_policy);
}

// Per-param-group settings that Megatron reads from the param group dict (ParamGroupOverride)
// and LibTorch's typed group options cannot hold. Absent values use the scheduler's.
struct ParamGroupOverrides {
  // Peak learning rate of this group. Default: nullopt (ParamSchedulerOptions::max_lr).
  std::optional<double> max_lr;
  // Final learning rate of this group. Default: nullopt (ParamSchedulerOptions::min_lr).
  std::optional<double> min_lr;
  // Initial weight decay of this group. Default: nullopt (ParamSchedulerOptions::start_wd).
  std::optional<double> start_wd;
  // Final weight decay of this group. Default: nullopt (ParamSchedulerOptions::end_wd).
  std::optional<double> end_wd;
  // Multiplies the group's scheduled weight decay. Default: 1.
  double wd_mult = 1.0;
  // Multiplies the group's scheduled learning rate (older Megatron and NeMo). Default: 1.
  double lr_mult = 1.0;
};

template <typename O, typename V, base::IsFieldsOf<O, ParamGroupOverrides> = 0>
void VisitFields(O& o, V&& v) {
  v("max_lr", o.max_lr);
  v("min_lr", o.min_lr);
  v("start_wd", o.start_wd);
  v("end_wd", o.end_wd);
  v("wd_mult", o.wd_mult);
  v("lr_mult", o.lr_mult);
}

// OptimizerParamScheduler.state_dict(): the same keys. The four weight-decay fields are
// absent only in checkpoints older than weight-decay scheduling; LoadStateDict then keeps
// the configured weight decay.
struct ParamSchedulerState {
  double max_lr = 0.0;
  int64_t lr_warmup_steps = 0;
  int64_t num_steps = 0;
  LrDecayStyle lr_decay_style = LrDecayStyle::kConstant;
  int64_t lr_decay_steps = 0;
  double min_lr = 0.0;
  std::optional<double> start_wd;
  std::optional<double> end_wd;
  std::optional<WdIncrStyle> wd_incr_style;
  std::optional<int64_t> wd_incr_steps;
};

template <typename O, typename V, base::IsFieldsOf<O, ParamSchedulerState> = 0>
void VisitFields(O& o, V&& v) {
  v("max_lr", o.max_lr);
  v("lr_warmup_steps", o.lr_warmup_steps);
  v("num_steps", o.num_steps);
  v("lr_decay_style", o.lr_decay_style);
  v("lr_decay_steps", o.lr_decay_steps);
  v("min_lr", o.min_lr);
  v("start_wd", o.start_wd);
  v("end_wd", o.end_wd);
  v("wd_incr_style", o.wd_incr_style);
  v("wd_incr_steps", o.wd_incr_steps);
}

// Checks `options` as Create does (see there for the rules). Errors: kInvalidArgument naming
// the first offending field, its value and what is allowed.
[[nodiscard]] absl::Status Validate(const ParamSchedulerOptions& options);

// Checks one param group's overrides against `options`: with a constant wd_incr_style its
// start and end weight decay must be equal. Errors: kInvalidArgument naming both values.
[[nodiscard]] absl::Status Validate(const ParamSchedulerOptions& options,
                                    const ParamGroupOverrides& group);

// Sets every param group's learning rate and, for the optimizers of optim::OptimizerKind's table
// (Adam, AdamW, SGD, RMSprop, Adagrad), weight decay, as a function of the step count.
//
// Values equal Megatron's bit for bit. Where Keel deliberately differs, it refuses earlier
// or more cleanly, never computes differently: inputs Megatron rejects only when a step
// reaches them (an unknown style, wd_incr_steps = 0, WSD without lr_wsd_decay_style, a
// group's uneven constant weight decay) are rejected by Create; LoadStateDict checks every
// field before changing anything, where Megatron may fail half-way through a load.
class ParamScheduler {
 public:
  // Validates `options` and `group_overrides` (entry i applies to param group i; groups
  // without an entry use the defaults) and sets the groups' values for step 0, as Megatron's
  // constructor does. Errors: kInvalidArgument naming the first option Megatron would
  // reject, at once or on a later step (Keel checks them all here): min_lr < 0,
  // max_lr < min_lr, init_lr > max_lr, lr_decay_steps <= 0, lr_warmup_steps >=
  // lr_decay_steps, kWsd without wsd_decay_steps or lr_wsd_decay_style, start_wd < 0,
  // end_wd < start_wd, a constant weight decay whose start and end differ (per group too),
  // wd_incr_steps = 0 with a non-constant style, both override and use-checkpoint set, or
  // more overrides than param groups.
  // Requires: `optimizer` outlives the scheduler.
  [[nodiscard]] static absl::StatusOr<ParamScheduler> Create(
      const ParamSchedulerOptions& options, torch::optim::Optimizer& optimizer,
      std::vector<ParamGroupOverrides> group_overrides = {});

  // The learning rate at the current step for a group with `group` overrides (get_lr).
  double GetLr(const ParamGroupOverrides& group = {}) const;

  // The weight decay at the current step for a group with `group` overrides, before
  // wd_mult (get_wd). Requires: with a constant wd_incr_style, the group's start and end
  // weight decay are equal (checked by Create for the optimizer's groups).
  double GetWd(const ParamGroupOverrides& group = {}) const;

  // Advances the step count by `increment` and sets every group's lr (GetLr × lr_mult) and
  // weight decay (GetWd × wd_mult). Errors: kInvalidArgument for a negative increment (nothing
  // changes).
  [[nodiscard]] absl::Status Step(int64_t increment);

  // The state to checkpoint (state_dict).
  ParamSchedulerState StateDict() const;

  // Restores `state` as options().load_policy says:
  // - each value is the checkpoint's if use_checkpoint_opt_param_scheduler, the options' if
  //   override_opt_param_scheduler, and otherwise must equal the options' value;
  // - kReference (Megatron's semantics, quirks included): num_steps is *added* through
  //   Step(num_steps), so load into a fresh scheduler (step 0) to resume (loading into one
  //   that has stepped counts those steps twice, as Megatron does); the weight-decay fields
  //   are applied after that Step, so the groups' weight decay reflects them from the next
  //   Step only;
  // - kCorrected: all fields are restored, then the step count becomes num_steps and every
  //   group gets that step's learning rate and weight decay from the restored schedule.
  // Unlike Megatron, every field is checked before anything changes, and the resulting
  // schedule is validated as Create does. Errors: kInvalidArgument naming the field and both
  // values on a mismatch, num_steps < 0, or a resulting schedule that Create would reject.
  [[nodiscard]] absl::Status LoadStateDict(const ParamSchedulerState& state);

  int64_t num_steps() const { return num_steps_; }
  const ParamSchedulerOptions& options() const { return options_; }

 private:
  ParamScheduler(const ParamSchedulerOptions& options, torch::optim::Optimizer& optimizer,
                 std::vector<ParamGroupOverrides> group_overrides);
  // Step without its check, for an increment known to be >= 0.
  void Advance(int64_t increment);

  ParamSchedulerOptions options_;
  torch::optim::Optimizer* optimizer_;
  std::optional<OptimizerKind> kind_;
  std::vector<ParamGroupOverrides> group_overrides_;
  int64_t num_steps_ = 0;
};

}  // namespace keel::optim

#endif  // KEEL_OPTIM_PARAM_SCHEDULER_H_
