// Training-loop bookkeeping, decision for decision with NeMo AutoModel's StepScheduler and
// StepSchedulerConfig (nemo_automodel/components/training/step_scheduler.py): groups
// micro-batches into optimizer steps (gradient accumulation), says when to checkpoint,
// validate, log and collect garbage, ends at max_steps or when epochs run out, and stops every
// rank at the same step when one of them is preempted.
//
//   KEEL_ASSIGN_OR_RETURN(auto scheduler, BuildStepScheduler(options, loader, dp, batch, group));
//   for (int64_t epoch : scheduler.Epochs()) {
//     scheduler.SetEpoch(epoch);
//     for (auto& micro_batches : scheduler) {  // grad_acc_steps of them (fewer at the tail)
//       Train(micro_batches);
//       if (scheduler.IsCkptStep()) Save(scheduler.StateDict());
//     }
//   }
#ifndef KEEL_SCHEDULING_STEP_SCHEDULER_H_
#define KEEL_SCHEDULING_STEP_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/fields.h"
#include "scheduling/preemption.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::scheduling {

// Mirrors StepSchedulerConfig: same field names, order and defaults. The runtime values (data
// source, dp size, local batch size, process group) are BuildStepScheduler arguments.
struct StepSchedulerOptions {
  // Samples per optimizer step across all data-parallel ranks. Default: 32.
  int64_t global_batch_size = 32;
  // Epochs to run; nullopt derives it from max_steps (10 if that is unknown too). Default: 10.
  std::optional<int64_t> num_epochs = 10;
  // Cap on optimizer steps; nullopt derives num_epochs * epoch_len. Default: nullopt.
  std::optional<int64_t> max_steps;
  // Checkpoint when step % N == N - 1; nullopt means once per epoch (max(1, max_steps / 2)
  // for a source without a length). Default: 100.
  std::optional<int64_t> ckpt_every_steps = 100;
  // Also checkpoint on each epoch's last batch. Default: true.
  bool save_checkpoint_every_epoch = true;
  // Checkpoint steps are validation steps too. Default: true.
  bool validate_on_checkpoint = true;
  // Validate when step % N == N - 1; nullopt disables periodic validation. Default: nullopt.
  std::optional<int64_t> val_every_steps;
  // Remote logging when step % N == 0. Default: 1.
  int64_t log_remote_every_steps = 1;
  // Rolling window, in steps, for averaged loss metrics. Default: 50.
  int64_t loss_average_window_steps = 50;
  // Garbage collection when step % N == 0; nullopt disables it. Default: nullopt.
  std::optional<int64_t> gc_every_steps;
  // Initial global step (resume). Default: 0.
  int64_t start_step = 0;
  // Initial epoch (resume). Default: 0.
  int64_t start_epoch = 0;
  // Signals that request a preemption checkpoint (see ResolveSignals); nullopt disables
  // preemption handling. Default: {"SIGTERM"}.
  std::optional<std::vector<std::string>> preemption_signal = std::vector<std::string>{"SIGTERM"};
};

template <typename O, typename V, base::IsFieldsOf<O, StepSchedulerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("global_batch_size", o.global_batch_size);
  v("num_epochs", o.num_epochs);
  v("max_steps", o.max_steps);
  v("ckpt_every_steps", o.ckpt_every_steps);
  v("save_checkpoint_every_epoch", o.save_checkpoint_every_epoch);
  v("validate_on_checkpoint", o.validate_on_checkpoint);
  v("val_every_steps", o.val_every_steps);
  v("log_remote_every_steps", o.log_remote_every_steps);
  v("loss_average_window_steps", o.loss_average_window_steps);
  v("gc_every_steps", o.gc_every_steps);
  v("start_step", o.start_step);
  v("start_epoch", o.start_epoch);
  v("preemption_signal", o.preemption_signal);
}

// StepScheduler.state_dict(): the same keys.
struct StepSchedulerState {
  int64_t step = 0;
  int64_t epoch = 0;
};

template <typename O, typename V, base::IsFieldsOf<O, StepSchedulerState> = 0>
void VisitFields(O& o, V&& v) {
  v("step", o.step);
  v("epoch", o.epoch);
}

// The runtime values StepSchedulerConfig.build takes, for a data source of known or unknown
// length (the number of micro-batches one pass yields; nullopt as for an IterableDataset).
struct StepScheduleRuntime {
  std::optional<int64_t> source_length;
  int64_t dp_size = 1;
  int64_t local_batch_size = 1;
  // Ranks that agree on preemption, a group that runs collectives on CPU tensors (Gloo; not
  // NCCL); nullptr for none. Requires: outlives the schedule.
  c10d::ProcessGroup* process_group = nullptr;
  // This rank's preemption flag; nullptr installs handlers for options.preemption_signal.
  std::unique_ptr<PreemptionFlag> preemption;
  // Called by SetEpoch: the data source's own set_epoch, if it has one.
  std::function<void(int64_t)> set_source_epoch;
};

// The counters, derived values and flags of a StepScheduler, independent of the data source
// type. StepScheduler<Source> adds the iteration over a source.
class StepSchedule {
 public:
  // Derives grad_acc_steps, epoch_len, num_epochs, max_steps and ckpt_every_steps as NeMo
  // does and installs the preemption handlers. Errors: kInvalidArgument with NeMo's message
  // for the first rule NeMo checks that fails: a non-positive global_batch_size,
  // local_batch_size or dp_size; global_batch_size not divisible by local_batch_size *
  // dp_size; a negative start_step or start_epoch; a non-positive num_epochs,
  // val_every_steps, log_remote_every_steps, loss_average_window_steps, gc_every_steps,
  // max_steps or ckpt_every_steps; no max_steps for a source without a length; a bad signal
  // list. Also, where NeMo would divide by zero or overflow: a data source of length 0 (NeMo
  // fails on the first flag read), local_batch_size * dp_size or num_epochs * epoch_len
  // beyond int64; and a process_group that cannot carry CPU tensors (NCCL).
  [[nodiscard]] static absl::StatusOr<StepSchedule> Create(const StepSchedulerOptions& options,
                                                           StepScheduleRuntime runtime);

  StepSchedule(StepSchedule&&) = default;
  StepSchedule& operator=(StepSchedule&&) = default;
  ~StepSchedule();

  int64_t grad_acc_steps() const { return grad_acc_steps_; }
  std::optional<int64_t> epoch_len() const { return epoch_len_; }
  int64_t num_epochs() const { return num_epochs_; }
  int64_t max_steps() const { return max_steps_; }
  int64_t ckpt_every_steps() const { return ckpt_every_steps_; }
  const StepSchedulerOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  int64_t epoch() const { return epoch_; }

  // step % log_remote_every_steps == 0.
  bool IsRemoteLoggingStep() const;
  // (step % val_every_steps == val_every_steps - 1, or a checkpoint step when
  // validate_on_checkpoint) and no preemption seen. Collective: as SigtermReceived.
  bool IsValStep();
  // step % ckpt_every_steps == ckpt_every_steps - 1, an epoch's last batch (if
  // save_checkpoint_every_epoch), the last step, or preemption: evaluated in that order, so
  // preemption is polled only when nothing before it fired, as in NeMo. Collective: as
  // SigtermReceived, when it polls.
  bool IsCkptStep();
  // step % gc_every_steps == 0, when gc_every_steps is set.
  bool IsGcStep() const;
  // step + 1 >= max_steps, or the last batch of the last epoch.
  bool IsLastStep() const;
  // step % epoch_len == epoch_len - 1 (false for a source without a length).
  bool IsLastBatch() const;
  // Whether preemption was requested on any rank. Polls at most once per step: the local flag,
  // all-reduced (MAX) over the process group, so every rank sees the same answer at the same
  // step. Once true, stays true. If the all-reduce fails, returns true (stop) and keeps the
  // error in preemption_status(). Collective: over the process group, when it polls.
  bool SigtermReceived();
  // Polls the preemption flag now, even if it was polled at this step, with SigtermReceived's
  // agreement across ranks, and returns its answer (which SigtermReceived then gives too): for
  // long work between two steps, such as validation, that must stop early. A Keel addition; the
  // flags NeMo defines keep polling at most once per step. Collective: over the process group.
  bool PollPreemption();
  // OK unless the preemption all-reduce failed.
  const absl::Status& preemption_status() const { return preemption_status_; }

  // Sets the epoch and forwards it to the data source's set_epoch.
  void SetEpoch(int64_t epoch);

  // {step: min(max_steps, step + 1), epoch}: the step to resume at when saved inside the loop.
  StepSchedulerState StateDict() const;
  // Restores step and epoch. Errors: kInvalidArgument for a negative step or epoch.
  [[nodiscard]] absl::Status LoadStateDict(const StepSchedulerState& state);

  // The epochs from the current one to num_epochs, stopping early at max_steps or preemption.
  // Collective: starting and advancing the range poll as SigtermReceived.
  class EpochRange;
  EpochRange Epochs();

 protected:
  // Bookkeeping for StepScheduler<Source>'s iteration.
  void FinishGroup() { ++step_; }
  void FinishEpoch() { ++epoch_; }
  bool StopAfterGroup() const { return step_ >= max_steps_ || sigterm_flag_; }

 private:
  StepSchedule(const StepSchedulerOptions& options, StepScheduleRuntime runtime);

  StepSchedulerOptions options_;
  StepScheduleRuntime runtime_;
  int64_t grad_acc_steps_ = 1;
  std::optional<int64_t> epoch_len_;
  int64_t num_epochs_ = 0;
  int64_t max_steps_ = 0;
  int64_t ckpt_every_steps_ = 0;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  bool sigterm_flag_ = false;
  std::optional<int64_t> sig_polled_step_;
  absl::Status preemption_status_;
};

class StepSchedule::EpochRange {
 public:
  class Iterator {
   public:
    int64_t operator*() const { return epoch_; }
    Iterator& operator++();
    bool operator!=(const Iterator& other) const { return epoch_ != other.epoch_; }

   private:
    friend class EpochRange;
    Iterator(StepSchedule* schedule, int64_t epoch, int64_t end);
    StepSchedule* schedule_;
    int64_t epoch_;
    int64_t end_;
  };
  // Captures the current epoch, as NeMo's generator does when it starts.
  Iterator begin() { return Iterator(schedule_, schedule_->epoch(), schedule_->num_epochs()); }
  Iterator end() { return Iterator(nullptr, schedule_->num_epochs(), schedule_->num_epochs()); }

 private:
  friend class StepSchedule;
  explicit EpochRange(StepSchedule* schedule) : schedule_(schedule) {}
  StepSchedule* schedule_;
};

namespace internal {
template <typename S, typename = void>
struct HasSize : std::false_type {};
template <typename S>
struct HasSize<S, std::void_t<decltype(std::declval<const S&>().size())>> : std::true_type {};
template <typename S, typename = void>
struct HasSetEpoch : std::false_type {};
template <typename S>
struct HasSetEpoch<S, std::void_t<decltype(std::declval<S&>().SetEpoch(int64_t{0}))>>
    : std::true_type {};
}  // namespace internal

// A StepSchedule iterating over a data source: anything range-for can iterate (a
// std::vector, a torch::data loader (`*loader`), a Keel sampler). A `size()` gives the
// epoch length; a `SetEpoch(int64_t)` receives SetEpoch.
// Iterating yields groups of grad_acc_steps micro-batches (a shorter group at the end of a
// pass), increments step after each group and stops at max_steps or on preemption; a pass
// that runs to the end of the source increments epoch. Each group is a std::vector of copies
// of the source's elements, valid until the next iteration.
template <typename Source>
class StepScheduler : public StepSchedule {
 public:
  using Batch = std::decay_t<decltype(*std::begin(std::declval<Source&>()))>;
  using Group = std::vector<Batch>;
  struct End {};

  class Iterator {
   public:
    Group& operator*() { return group_; }
    Iterator& operator++() {
      scheduler_->FinishGroup();
      if (partial_) {
        scheduler_->FinishEpoch();
        done_ = true;
      } else if (scheduler_->StopAfterGroup()) {
        done_ = true;  // as NeMo: the source is not advanced past the last group
      } else {
        ++*it_;
        Fill();
      }
      return *this;
    }
    bool operator!=(End) const { return !done_; }

   private:
    friend class StepScheduler;
    using SourceIterator = decltype(std::begin(std::declval<Source&>()));

    explicit Iterator(StepScheduler* scheduler) : scheduler_(scheduler) {
      if (scheduler_->step() >= scheduler_->max_steps()) {
        done_ = true;
        return;
      }
      it_.emplace(std::begin(*scheduler_->source_));
      Fill();
    }

    // Collects up to grad_acc_steps micro-batches; the source iterator stays on the last one.
    void Fill() {
      group_.clear();
      const auto end = std::end(*scheduler_->source_);
      while (*it_ != end) {
        group_.push_back(**it_);
        if (static_cast<int64_t>(group_.size()) == scheduler_->grad_acc_steps()) return;
        ++*it_;
      }
      if (!group_.empty()) {
        partial_ = true;
        return;
      }
      scheduler_->FinishEpoch();
      done_ = true;
    }

    StepScheduler* scheduler_;
    std::optional<SourceIterator> it_;
    Group group_;
    bool partial_ = false;
    bool done_ = false;
  };

  Iterator begin() { return Iterator(this); }
  End end() { return End{}; }

 private:
  template <typename S>
  friend absl::StatusOr<StepScheduler<S>> BuildStepScheduler(const StepSchedulerOptions&, S&,
                                                             int64_t, int64_t, c10d::ProcessGroup*,
                                                             std::unique_ptr<PreemptionFlag>);
  StepScheduler(StepSchedule schedule, Source& source)
      : StepSchedule(std::move(schedule)), source_(&source) {}

  Source* source_;
};

// StepSchedulerConfig.build: a StepScheduler over `source` (see StepSchedule::Create for the
// errors). `preemption` replaces the OS signal handlers as this rank's flag (tests, agents).
// Requires: `source` and `process_group` outlive the scheduler.
template <typename Source>
[[nodiscard]] absl::StatusOr<StepScheduler<Source>> BuildStepScheduler(
    const StepSchedulerOptions& options, Source& source, int64_t dp_size, int64_t local_batch_size,
    c10d::ProcessGroup* process_group = nullptr,
    std::unique_ptr<PreemptionFlag> preemption = nullptr) {
  StepScheduleRuntime runtime;
  if constexpr (internal::HasSize<Source>::value) {
    runtime.source_length = static_cast<int64_t>(source.size());
  }
  if constexpr (internal::HasSetEpoch<Source>::value) {
    runtime.set_source_epoch = [&source](int64_t epoch) { source.SetEpoch(epoch); };
  }
  runtime.dp_size = dp_size;
  runtime.local_batch_size = local_batch_size;
  runtime.process_group = process_group;
  runtime.preemption = std::move(preemption);
  absl::StatusOr<StepSchedule> schedule = StepSchedule::Create(options, std::move(runtime));
  if (!schedule.ok()) return schedule.status();
  return StepScheduler<Source>(*std::move(schedule), source);
}

}  // namespace keel::scheduling

#endif  // KEEL_SCHEDULING_STEP_SCHEDULER_H_
