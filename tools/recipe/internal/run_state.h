// What a Run holds between its steps (Run::State), shared by the files that implement Run
// along its seams: run.cc (Build and the loop), run_build.cc (the model, optimizer and
// checkpoint wiring), run_resume.cc (resume policy), run_step.cc (a step's arithmetic and
// validation) and run_report.cc (the outputs and the summary).
#ifndef KEEL_TOOLS_RECIPE_INTERNAL_RUN_STATE_H_
#define KEEL_TOOLS_RECIPE_INTERNAL_RUN_STATE_H_

#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_state.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/training_state.h"
#include "models/language_model.h"
#include "optim/data_parallel_optimizer.h"
#include "optim/param_scheduler.h"
#include "parallel/comm_timers.h"
#include "sampling/megatron_sampler.h"
#include "sampling/resumable_blend.h"
#include "scheduling/step_scheduler.h"
#include "tools/recipe/data.h"
#include "tools/recipe/metrics.h"
#include "tools/recipe/numerics.h"
#include "tools/recipe/options.h"
#include "tools/recipe/profile.h"
#include "tools/recipe/run.h"
#include "tools/recipe/tensorboard.h"
#include "tools/recipe/watchdog.h"

namespace keel::tools::recipe {

using Clock = std::chrono::steady_clock;
using Scheduler = scheduling::StepScheduler<sampling::MegatronSampler>;

inline double Seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

// Everything the run builds, in the order it is built.
class Run::State {
 public:
  explicit State(TrainData data) : data(std::move(data)) {}

  TrainData data;
  std::shared_ptr<models::LanguageModel> model;
  std::unique_ptr<optim::DataParallelOptimizer> optimizer;
  std::optional<Scheduler> scheduler;
  // options.lr_scheduler with the step counts derived from the scheduler's length.
  optim::ParamSchedulerOptions lr_schedule;
  std::optional<optim::ParamScheduler> lr_scheduler;
  // The sampler's state before any step, for ResetState.
  sampling::MegatronSamplerState initial_sampler_state;
  // What a checkpoint holds, under these names.
  std::unique_ptr<checkpoint::ModelState> model_state;
  std::optional<checkpoint::OptimizerState> optim_state;
  std::unique_ptr<checkpoint::Stateful> step_state;
  std::unique_ptr<checkpoint::Stateful> sampler_state;
  std::unique_ptr<checkpoint::RngState> rng_state;
  std::unique_ptr<ConfigState> config_state;
  std::unique_ptr<NonFiniteGuard> numerics;
  // data.paths: the training blend's state ("data"), and the one a resume loaded.
  std::unique_ptr<checkpoint::Stateful> data_state;
  std::optional<sampling::BlendState> loaded_blend;
  checkpoint::Statefuls statefuls;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  // Rank 0's outputs.
  std::optional<JsonlWriter> jsonl;
  std::optional<StepProfiler> profiler;
  std::optional<TensorBoardWriter> tensorboard;
  // The hang watchdog, from the loop's start to the end of Finish.
  std::unique_ptr<HangWatchdog> watchdog;
  // Time spent in the scheduler, the sampler and the LR schedule.
  Clock::duration bookkeeping{};
  // Time spent after the backward passes waiting for the data-parallel gradient reduction.
  Clock::duration gradient_wait{};
  // When the loop started.
  Clock::time_point loop_start;
  // The parallel blocks' communication, counted from the loop's start to Finish.
  parallel::CommTimers comm_timers;
  std::optional<parallel::CommTimers::Scope> counting;
  // Label tokens since the last progress line, and when it was.
  Clock::time_point interval_start;
  int64_t interval_tokens = 0;

  // Runs `fn`, adding its time to `total`.
  template <typename Fn>
  static decltype(auto) Timed(Clock::duration& total, Fn&& fn) {
    struct Timer {
      Clock::time_point start;
      Clock::duration& total;
      ~Timer() { total += Clock::now() - start; }
    } timer{Clock::now(), total};
    return fn();
  }

  // The step being run (or just run, until the scheduler moves on) is now in `phase`.
  void Enter(Phase phase) {
    if (watchdog != nullptr) watchdog->Enter(scheduler->step() + 1, phase);
  }

  // Runs `fn`, counting its time as bookkeeping.
  template <typename Fn>
  decltype(auto) Bookkept(Fn&& fn) {
    return Timed(bookkeeping, std::forward<Fn>(fn));
  }
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_INTERNAL_RUN_STATE_H_
