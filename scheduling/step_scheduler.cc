#include "scheduling/step_scheduler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "torch/types.h"

namespace keel::scheduling {
namespace {

// Python's ceil(a / b) for ints: a correctly rounded true division, then ceil. Integer
// arithmetic gives the same result while both fit a double exactly.
int64_t PythonCeilDiv(int64_t a, int64_t b) {
  constexpr int64_t kExact = int64_t{1} << 53;
  if (a < kExact && a > -kExact && b < kExact && b > -kExact) {
    const int64_t quotient = a / b;
    return quotient + ((a % b != 0) && ((a < 0) == (b < 0)) ? 1 : 0);
  }
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(static_cast<long double>(a) / static_cast<long double>(b))));
}

absl::Status Positive(absl::string_view name, int64_t value, absl::string_view suffix = "") {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be greater than 0", suffix, ", got ", value));
}

// NeMo's first checks, in its order and words: the batch sizes and the start position.
// Returns local_batch_size * dp_size.
absl::StatusOr<int64_t> CheckBatchesAndStart(const StepSchedulerOptions& options,
                                             const StepScheduleRuntime& runtime) {
  KEEL_RETURN_IF_ERROR(Positive("global_batch_size", options.global_batch_size));
  KEEL_RETURN_IF_ERROR(Positive("local_batch_size", runtime.local_batch_size));
  KEEL_RETURN_IF_ERROR(Positive("dp_size", runtime.dp_size));
  int64_t local_global_batch_size = 0;
  if (__builtin_mul_overflow(runtime.local_batch_size, runtime.dp_size, &local_global_batch_size)) {
    return absl::InvalidArgumentError(absl::StrCat("local_batch_size (", runtime.local_batch_size,
                                                   ") * dp_size (", runtime.dp_size,
                                                   ") overflows int64"));
  }
  if (options.global_batch_size % local_global_batch_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch_size (", options.global_batch_size,
                     ") must be divisible by local_batch_size * dp_size (",
                     runtime.local_batch_size, " * ", runtime.dp_size, ")"));
  }
  if (options.start_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_step must be greater than or equal to 0, got ", options.start_step));
  }
  if (options.start_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start_epoch must be greater than or equal to 0, got ", options.start_epoch));
  }
  return local_global_batch_size;
}

}  // namespace

absl::StatusOr<StepSchedule> StepSchedule::Create(const StepSchedulerOptions& options,
                                                  StepScheduleRuntime runtime) {
  KEEL_RETURN_IF_ERROR(
      base::CheckGroupCarries(runtime.process_group, at::kCPU, "the step scheduler's exchanges"));
  KEEL_ASSIGN_OR_RETURN(const int64_t local_global_batch_size,
                        CheckBatchesAndStart(options, runtime));
  StepSchedule schedule(options, std::move(runtime));
  schedule.grad_acc_steps_ = options.global_batch_size / local_global_batch_size;
  if (const std::optional<int64_t>& length = schedule.runtime_.source_length) {
    // NeMo divides by epoch_len = 0 as soon as a flag is read (ZeroDivisionError).
    if (*length <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the data source yields no micro-batch (its length is ", *length,
                       "): a StepScheduler needs at least one; check the dataset and the sampler's "
                       "batch sizes"));
    }
    schedule.epoch_len_ = PythonCeilDiv(*length, schedule.grad_acc_steps_);
  }
  const std::optional<int64_t>& epoch_len = schedule.epoch_len_;

  if (options.num_epochs.has_value()) {
    schedule.num_epochs_ = *options.num_epochs;
  } else if (epoch_len.has_value() && options.max_steps.has_value()) {
    schedule.num_epochs_ = PythonCeilDiv(*options.max_steps, *epoch_len);
  } else {
    schedule.num_epochs_ = 10;
  }
  if (schedule.num_epochs_ <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_epochs must be greater than 0 or None if max_steps is provided, got ",
                     schedule.num_epochs_));
  }
  if (options.val_every_steps.has_value()) {
    if (absl::Status s = Positive("val_every_steps", *options.val_every_steps, " if not None");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = Positive("log_remote_every_steps", options.log_remote_every_steps);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Positive("loss_average_window_steps", options.loss_average_window_steps);
      !s.ok()) {
    return s;
  }
  if (options.gc_every_steps.has_value()) {
    if (absl::Status s = Positive("gc_every_steps", *options.gc_every_steps, " if not None");
        !s.ok()) {
      return s;
    }
  }
  if (options.max_steps.has_value()) {
    schedule.max_steps_ = *options.max_steps;
  } else {
    if (!epoch_len.has_value()) {
      return absl::InvalidArgumentError("epoch_len must be provided if max_steps is not provided");
    }
    if (__builtin_mul_overflow(schedule.num_epochs_, *epoch_len, &schedule.max_steps_)) {
      return absl::InvalidArgumentError(absl::StrCat("num_epochs (", schedule.num_epochs_,
                                                     ") * epoch_len (", *epoch_len,
                                                     ") overflows int64"));
    }
  }
  if (absl::Status s = Positive("max_steps", schedule.max_steps_); !s.ok()) return s;
  if (options.ckpt_every_steps.has_value()) {
    schedule.ckpt_every_steps_ = *options.ckpt_every_steps;
  } else {
    schedule.ckpt_every_steps_ =
        epoch_len.has_value() ? *epoch_len : std::max<int64_t>(1, schedule.max_steps_ / 2);
  }
  if (absl::Status s = Positive("ckpt_every_steps", schedule.ckpt_every_steps_); !s.ok()) return s;

  if (schedule.runtime_.preemption == nullptr && options.preemption_signal.has_value()) {
    absl::StatusOr<std::vector<int>> signals = ResolveSignals(*options.preemption_signal);
    if (!signals.ok()) return signals.status();
    absl::StatusOr<std::unique_ptr<SignalPreemptionFlag>> flag =
        SignalPreemptionFlag::Create(*signals);
    if (!flag.ok()) return flag.status();
    schedule.runtime_.preemption = *std::move(flag);
  }
  return schedule;
}

StepSchedule::StepSchedule(const StepSchedulerOptions& options, StepScheduleRuntime runtime)
    : options_(options),
      runtime_(std::move(runtime)),
      step_(options.start_step),
      epoch_(options.start_epoch) {}

StepSchedule::~StepSchedule() = default;

bool StepSchedule::IsRemoteLoggingStep() const {
  return step_ % options_.log_remote_every_steps == 0;
}

bool StepSchedule::IsValStep() {
  const std::optional<int64_t>& every = options_.val_every_steps;
  const bool is_val = every.has_value() && step_ % *every == *every - 1;
  const bool is_checkpoint_validation = options_.validate_on_checkpoint && IsCkptStep();
  return (is_val || is_checkpoint_validation) && !sigterm_flag_;
}

bool StepSchedule::IsCkptStep() {
  const bool is_ckpt_step = step_ % ckpt_every_steps_ == ckpt_every_steps_ - 1;
  const bool is_epoch_boundary = options_.save_checkpoint_every_epoch && IsLastBatch();
  return is_ckpt_step || is_epoch_boundary || IsLastStep() || SigtermReceived();
}

bool StepSchedule::IsGcStep() const {
  return options_.gc_every_steps.has_value() && step_ % *options_.gc_every_steps == 0;
}

bool StepSchedule::IsLastStep() const {
  if (step_ + 1 >= max_steps_) return true;
  if (epoch_ + 1 >= num_epochs_) return IsLastBatch();
  return false;
}

bool StepSchedule::IsLastBatch() const {
  return epoch_len_.has_value() && step_ % *epoch_len_ == *epoch_len_ - 1;
}

bool StepSchedule::SigtermReceived() {
  if (sigterm_flag_) return true;
  if (runtime_.preemption == nullptr) return false;
  if (sig_polled_step_ == step_) return false;
  sig_polled_step_ = step_;
  bool received = runtime_.preemption->Received();
  if (runtime_.process_group != nullptr) {
    at::Tensor flag = torch::full({1}, received ? 1 : 0, torch::kInt32);
    preemption_status_ =
        base::AllReduce(flag, base::Reduce::kMax, *runtime_.process_group, "the preemption flag");
    received = !preemption_status_.ok() || flag.item<int32_t>() != 0;
  }
  sigterm_flag_ = received;
  return sigterm_flag_;
}

bool StepSchedule::PollPreemption() {
  sig_polled_step_.reset();
  return SigtermReceived();
}

void StepSchedule::SetEpoch(int64_t epoch) {
  epoch_ = epoch;
  if (runtime_.set_source_epoch) runtime_.set_source_epoch(epoch);
}

StepSchedulerState StepSchedule::StateDict() const {
  return StepSchedulerState{std::min(max_steps_, step_ + 1), epoch_};
}

absl::Status StepSchedule::LoadStateDict(const StepSchedulerState& state) {
  if (state.step < 0 || state.epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("load_state_dict: step (", state.step,
                                                   ") and epoch (", state.epoch, ") must be >= 0"));
  }
  step_ = state.step;
  epoch_ = state.epoch;
  return absl::OkStatus();
}

StepSchedule::EpochRange StepSchedule::Epochs() { return EpochRange(this); }

StepSchedule::EpochRange::Iterator::Iterator(StepSchedule* schedule, int64_t epoch, int64_t end)
    : schedule_(schedule), epoch_(epoch), end_(end) {
  if (schedule_ == nullptr) return;
  if (epoch_ >= end_) {
    epoch_ = end_;
  } else if (schedule_->step() >= schedule_->max_steps() || schedule_->SigtermReceived()) {
    epoch_ = end_;
  }
}

StepSchedule::EpochRange::Iterator& StepSchedule::EpochRange::Iterator::operator++() {
  ++epoch_;
  if (epoch_ < end_ &&
      (schedule_->step() >= schedule_->max_steps() || schedule_->SigtermReceived())) {
    epoch_ = end_;
  }
  return *this;
}

}  // namespace keel::scheduling
