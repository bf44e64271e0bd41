#include "tools/recipe/run.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "base/tensor_memory.h"
#include "tools/recipe/internal/run_state.h"
#include "tools/recipe/memory.h"
#include "tools/recipe/run_dir_lock.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

Run::Run(const TrainOptions& options, TrainRuntime runtime)
    : options_(options), runtime_(std::move(runtime)) {}

Run::~Run() = default;

int64_t Run::step() const { return state_->scheduler->step(); }

absl::StatusOr<std::unique_ptr<Run>> Run::Build(const TrainOptions& options, TrainRuntime runtime) {
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(options.run_dir));
  std::unique_ptr<Run> run(new Run(options, std::move(runtime)));
  KEEL_ASSIGN_OR_RETURN(TrainData data, OpenTrainData(run->options_, run->runtime_));
  run->state_ = std::make_unique<State>(std::move(data));
  State& s = *run->state_;
  absl::StatusOr<Scheduler> scheduler = scheduling::BuildStepScheduler(
      options.step_scheduler, *s.data.sampler, run->runtime_.dp_size, options.local_batch_size,
      run->runtime_.control_group(), std::move(run->runtime_.preemption));
  KEEL_RETURN_IF_ERROR(base::Annotate(
      scheduler.status(), absl::StrCat("step_scheduler over the ", s.data.splits.train_size(),
                                       " training windows of ", s.data.prefix)));
  s.scheduler = *std::move(scheduler);
  KEEL_RETURN_IF_ERROR(CheckStepsLeft(s.scheduler->step(), s.scheduler->epoch(),
                                      s.scheduler->max_steps(), s.scheduler->num_epochs()));
  s.initial_sampler_state = s.data.sampler->State();
  const int64_t total_steps =
      TotalSteps(s.scheduler->max_steps(), s.scheduler->epoch_len(), s.scheduler->num_epochs());
  s.lr_schedule = LrSchedule(options.lr_scheduler, options.derived_lr_steps, total_steps);
  if (run->runtime_.rank == 0) {
    for (const std::string& warning : LrScheduleWarnings(s.lr_schedule, total_steps)) {
      *run->runtime_.log << "warning: " << warning << "\n";
    }
  }
  KEEL_RETURN_IF_ERROR(run->BuildModel());
  KEEL_RETURN_IF_ERROR(run->BuildCheckpointing());
  return run;
}

absl::Status Run::AfterStep(StepMetrics& metrics) {
  State& s = *state_;
  const bool validate = s.Bookkept([&] { return s.scheduler->IsValStep(); });
  if (validate && s.data.splits.val_size() > 0) {
    KEEL_ASSIGN_OR_RETURN(metrics.val_loss, Validate());
  }
  s.Enter(Phase::kReporting);
  if (metrics.step % options_.logging.log_every_steps == 0 || validate) {
    const double seconds = Seconds(Clock::now() - s.interval_start);
    metrics.tokens_per_second = seconds > 0 ? s.interval_tokens / seconds : 0.0;
    metrics.max_memory_allocated_gib =
        static_cast<double>(base::TakePeakTensorMemory(runtime_.device)) / (1 << 30);
    s.interval_start = Clock::now();
    s.interval_tokens = 0;
    // Flushed: a pipe or file (tee, a job log) shows progress as it happens.
    if (runtime_.rank == 0) {
      *runtime_.log << ProgressLine(metrics, s.scheduler->max_steps(), result_.start_step)
                    << std::endl;
    }
  }
  if (runtime_.rank == 0) KEEL_RETURN_IF_ERROR(Record(metrics));
  if (!s.Bookkept([&] { return s.scheduler->IsCkptStep(); })) return absl::OkStatus();
  const scheduling::StepSchedulerState at = s.scheduler->StateDict();
  s.Enter(Phase::kCheckpoint);
  return s.checkpointer->Save(s.statefuls, at.step, at.epoch);
}

absl::Status Run::Loop() {
  State& s = *state_;
  Scheduler& scheduler = *s.scheduler;
  KEEL_RETURN_IF_ERROR(OpenOutputs());
  s.profiler.emplace(runtime_.rank == 0 ? options_.logging : LoggingOptions(), options_.run_dir,
                     runtime_.device);
  WatchdogOptions watchdog;
  if (options_.distributed.hang_timeout_seconds.has_value()) {
    watchdog.timeout_seconds = static_cast<double>(*options_.distributed.hang_timeout_seconds);
  }
  s.watchdog = std::make_unique<HangWatchdog>(runtime_.rank, runtime_.world_size, runtime_.store(),
                                              std::move(watchdog));
  s.loop_start = s.interval_start = Clock::now();
  base::TakePeakTensorMemory(runtime_.device);  // the first interval counts steps, not the setup
  s.counting.emplace(s.comm_timers);
  result_.final_loss = std::numeric_limits<double>::quiet_NaN();
  for (int64_t epoch : scheduler.Epochs()) {
    scheduler.SetEpoch(epoch);
    auto it = s.Bookkept([&] { return scheduler.begin(); });
    while (it != scheduler.end()) {
      KEEL_RETURN_IF_ERROR(s.profiler->BeforeStep(scheduler.step() + 1));
      KEEL_ASSIGN_OR_RETURN(StepOutput output, Step(*it));
      StepMetrics metrics;
      metrics.step = scheduler.step() + 1;
      KEEL_RETURN_IF_ERROR(s.profiler->AfterStep(metrics.step, *runtime_.log));
      metrics.epoch = scheduler.epoch();
      metrics.loss = output.loss;
      metrics.lr = output.lr;
      metrics.grad_norm = output.grad_norm;
      metrics.moe_aux_loss = output.moe_aux_loss;
      metrics.tokens_per_expert = output.tokens_per_expert;
      if (resumed_ && metrics.step == result_.start_step + 1) {
        metrics.resumed_from_step = result_.start_step;
      }
      if (runtime_.restart_count > 0 && metrics.step == result_.start_step + 1) {
        metrics.restart_count = runtime_.restart_count;
        metrics.restart_cause =
            runtime_.restart_cause.empty() ? "not given by the launcher" : runtime_.restart_cause;
      }
      if (options_.numerics.on_nonfinite == NonFinitePolicy::kSkip) {
        metrics.skipped_steps = s.numerics->state().skipped_steps;
      }
      s.interval_tokens += output.label_tokens;
      metrics.elapsed_seconds = Seconds(Clock::now() - s.loop_start);
      result_.final_loss = metrics.loss;
      KEEL_RETURN_IF_ERROR(AfterStep(metrics));
      s.Bookkept([&] { ++it; });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Train(const TrainOptions& options, TrainRuntime runtime) {
  // A model state that cannot fit is refused before anything is read, written or built.
  KEEL_ASSIGN_OR_RETURN(const parallel::MeshLayout layout,
                        CheckGeometry(options, runtime.world_size));
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(
      CheckModelStateFits(
          options, layout,
          {runtime.device, base::DeviceMemoryCapacity(runtime.device),
           base::DeviceMemoryCapacity(at::Device(at::kCPU)), runtime.local_world_size}),
      runtime, "checking that the model state fits"));
  // One run per run directory: rank 0 locks it before anything reads or writes there.
  std::optional<RunDirLock> lock;
  absl::Status locked;
  if (runtime.rank == 0) {
    absl::StatusOr<RunDirLock> acquired = RunDirLock::Acquire(options.run_dir);
    locked = acquired.status();
    if (acquired.ok()) lock.emplace(*std::move(acquired));
  }
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(locked, runtime, "locking the run directory"));
  // Before the model and its state exist, so that the peaks the metrics report count them.
  base::TrackTensorMemory(runtime.device);
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, Run::Build(options, std::move(runtime)));
  KEEL_RETURN_IF_ERROR(run->Resume().status());
  KEEL_RETURN_IF_ERROR(run->Loop());
  return run->Finish();
}

}  // namespace keel::tools::recipe
