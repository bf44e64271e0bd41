// The training recipe of //tools:train, NeMo AutoModel's pretraining recipe in C++, in named
// steps: Build (data, model, optimizer, schedules, checkpointer), Resume (the newest valid
// checkpoint), Step (one optimizer step over a group of micro-batches), Loop (epochs and steps
// from the StepScheduler, validation, logging and checkpoints until max_steps or preemption)
// and Finish (the last checkpoint, the plot). Train runs them in that order.
//
//   KEEL_ASSIGN_OR_RETURN(TrainOptions options, ReadOptions(config));
//   KEEL_ASSIGN_OR_RETURN(TrainResult result, Train(options, std::move(runtime)));
#ifndef KEEL_TOOLS_RECIPE_RUN_H_
#define KEEL_TOOLS_RECIPE_RUN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/recipe/metrics.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

struct TrainResult {
  // The step the run ended at (its StepScheduler's step) and the one it started from.
  int64_t final_step = 0;
  int64_t start_step = 0;
  // Loss of the last step run (NaN if none ran).
  double final_loss = 0.0;
  // Whether the run stopped for a preemption request (after checkpointing).
  bool preempted = false;
  // Seconds of the loop spent in Keel's bookkeeping (step scheduler and sampler iteration, LR
  // schedule; not clipping), and in the whole loop.
  double bookkeeping_seconds = 0.0;
  double loop_seconds = 0.0;
  // Seconds of the loop spent waiting, after the backward passes, for the data-parallel
  // gradient reduction (what backward did not overlap); 0 on one rank.
  double gradient_wait_seconds = 0.0;
  // Seconds of the loop spent in the tensor-parallel collectives (forward and backward,
  // validation included); 0 without tensor parallelism.
  double tensor_parallel_seconds = 0.0;
  // Seconds of the loop this rank's pipeline stage spent waiting for an activation or a
  // gradient (the pipeline bubble and the transfers); 0 on one stage.
  double pipeline_wait_seconds = 0.0;
  // Seconds of the loop spent in the experts' all-to-alls; 0 without expert parallelism.
  double expert_dispatch_seconds = 0.0;
};

// What one optimizer step computed.
struct StepOutput {
  // Mean loss over the global batch's label tokens, and the learning rate and gradient norm
  // (before clipping) of the step.
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  // Label tokens of the global batch.
  int64_t label_tokens = 0;
  // The step was dropped for a non-finite loss or gradient norm (numerics.on_nonfinite
  // "skip"): no update, no learning-rate step.
  bool skipped = false;
  // Mixture of experts only: StepMetrics' moe_aux_loss and tokens_per_expert.
  std::optional<double> moe_aux_loss;
  std::optional<std::vector<int64_t>> tokens_per_expert;
};

class Run {
 public:
  // Builds everything the run needs; creates run_dir. Collective: over the runtime's groups
  // (corpus preparation, the data-parallel sync). Errors: kNotFound or kDataLoss for the
  // data; kInvalidArgument from the components' options (the step scheduler's batch
  // geometry, the LR schedule, the sampler, the peft section); as LoadPretrained with peft.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Run>> Build(const TrainOptions& options,
                                                                  TrainRuntime runtime);
  ~Run();

  // Loads the newest checkpoint under checkpoint_dir that loads, if any, and returns its path.
  // Checkpoints that do not load are moved to <checkpoint_dir>/quarantine with a warning, and
  // the state is reset after each that failed part-way; a checkpoint of another
  // configuration warns, field by field, and one of another model is an error naming the
  // fields (another peft section's adapters too). When none loads, a new run starts from
  // model.pretrained_path's weights, if set (LoadPretrained), and peft.adapter_path's adapter
  // (LoadPeftAdapter); a resumed run ignores them, saying so, except a LoRA run's base, which
  // Build loaded. Collective. Errors: as Checkpointer::LoadLatest; kInvalidArgument for
  // another model; as LoadPretrained and LoadPeftAdapter.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> Resume();

  // One optimizer step over `micro_batches` (this rank's sample indices of each micro-batch):
  // forward and backward of each (through the pipeline stages in the 1F1B order), the gradient
  // sync on the last, the tied embedding's gradients summed over its stages, clipping, the check
  // for non-finite values (NonFiniteGuard), the optimizer and LR steps. The loss is the mean over
  // the global batch's label tokens, however the batch is split into micro-batches and ranks.
  // Collective. Errors: kAborted for a non-finite loss or gradient norm that stops the run
  // (before the optimizer step); kUnavailable from peers.
  [[nodiscard]] absl::StatusOr<StepOutput> Step(
      const std::vector<std::vector<int64_t>>& micro_batches);

  // Mean validation loss per label token over the whole validation split, shared by the ranks
  // (NaN without a validation split); nullopt when a preemption request arrives first (polled
  // after every batch). Collective. Errors: kUnavailable from peers.
  [[nodiscard]] absl::StatusOr<std::optional<double>> Validate();

  // Trains from the current step until max_steps, the end of the epochs or a preemption
  // checkpoint: each step is followed by validation, logging and a checkpoint as the step
  // scheduler says. Collective.
  [[nodiscard]] absl::Status Loop();

  // Waits for the last (asynchronous) checkpoint; rank 0 writes the plot and a summary line.
  [[nodiscard]] absl::StatusOr<TrainResult> Finish();

  const TrainOptions& options() const { return options_; }
  int64_t step() const;

 private:
  class State;
  Run(const TrainOptions& options, TrainRuntime runtime);
  absl::Status BuildModel();
  absl::Status BuildCheckpointing();
  // After a failed load wrote part of a checkpoint: the model, optimizer, schedules and
  // sampler back as Build made them, in place (the checkpoint's objects hold them).
  absl::Status ResetState();
  // After a resume on another number of ranks than saved the checkpoint: seeds each rank's
  // generator from the seed, its rank and the step (the saved rows belong to other ranks), and
  // says so, and what it means for the sampler's epoch.
  void ContinueOnNewWorldSize(int64_t saved_world_size);
  // Compares this run's configuration with the checkpoint's at `path` (before_load): the fields
  // that differ go to `changes`; another model is an error (a LoRA run's padded vocabulary
  // aside, unless an adapter has its rows: the frozen base is not in the checkpoint).
  absl::Status CheckConfig(const std::string& path, std::vector<std::string>& changes) const;
  // Whether a LoRA adapter sits on a layer whose rows are the (padded) vocabulary.
  bool AdaptsVocabulary() const;
  // Loads the model's weights from model.pretrained_path (checkpoint::LoadHfSafetensors, with
  // the checkpoint's key layout) on every rank, all agreeing on the outcome.
  absl::Status LoadPretrained();
  // A new LoRA run's adapters from peft.adapter_path (peft::LoadPeftAdapter), if set, on every
  // rank, all agreeing on the outcome.
  absl::Status LoadPeftAdapter();
  absl::Status OpenOutputs();
  // Mixture of experts: the routing statistics of the step's micro-batches into `output`,
  // summed over the data-parallel ranks and the pipeline stages, and the model's taken back
  // to none. Collective: over the data-parallel group, then the pipeline group.
  absl::Status CollectMoeStats(StepOutput& output, int64_t micro_batches);
  // clip_grad.check_norm_every_steps: on those steps, `norm` (ClipGradNorm's) against the
  // norm of every rank's gradient blocks; an error naming the parameters when they differ.
  // Collective: over the control group, on those steps.
  absl::Status CheckNorm(double norm);
  // Validation, logging and the checkpoint after a step.
  absl::Status AfterStep(StepMetrics& metrics);
  absl::Status Record(const StepMetrics& metrics);

  TrainOptions options_;
  TrainRuntime runtime_;
  std::unique_ptr<State> state_;
  bool resumed_ = false;
  TrainResult result_;
};

// Locks the run directory (rank 0, before anything reads or writes there), then Build, Resume,
// Loop, Finish. Errors: kFailedPrecondition naming the directory and the process when another
// run holds it; those of the steps.
[[nodiscard]] absl::StatusOr<TrainResult> Train(const TrainOptions& options, TrainRuntime runtime);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_RUN_H_
