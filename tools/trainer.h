// The training loop of //tools:train, NeMo AutoModel's pretraining recipe in C++: epochs and
// step groups from the StepScheduler over a Megatron sampler of GPT windows, micro-batches with
// the data-parallel sync only on the last one, the loss normalised by the global batch's label
// tokens, clipping, the optimizer and OptimizerParamScheduler steps, validation on
// IsValStep, (async) checkpoints on IsCkptStep, and a clean stop after a preemption checkpoint.
// Every step's metrics go to <run_dir>/metrics.jsonl, TensorBoard events and, at the end, an
// SVG plot; rerunning on the same run_dir resumes from the newest valid checkpoint.
//
//   KEEL_ASSIGN_OR_RETURN(TrainConfig config, LoadTrainConfig(path, overrides));
//   KEEL_ASSIGN_OR_RETURN(TrainResult result, Train(config, runtime));
#ifndef KEEL_TOOLS_TRAINER_H_
#define KEEL_TOOLS_TRAINER_H_

#include <cstdint>
#include <memory>
#include <ostream>

#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "scheduling/preemption.h"
#include "tools/train_config.pb.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::tools {

// Where the run happens: this process's rank and its process groups.
struct TrainRuntime {
  int rank = 0;
  int world_size = 1;
  // Where the model trains: the CPU, or this rank's GPU with the NCCL backend.
  at::Device device = at::kCPU;
  // The data-parallel group for tensors on `device` (gradient sync); nullptr for a single
  // process.
  c10d::ProcessGroup* group = nullptr;
  // A CPU (Gloo) group over the same ranks for host scalars: token counts, losses, the
  // preemption flag. With Gloo training it is `group` itself; nullptr for a single process.
  c10d::ProcessGroup* control_group = nullptr;
  // A second group over the same ranks for checkpoint exchanges (async saves run them on a
  // background thread); nullptr for a single process.
  c10d::ProcessGroup* checkpoint_group = nullptr;
  // Progress lines and notices (rank 0 writes them).
  std::ostream* log = nullptr;
  // This rank's preemption flag; nullptr installs handlers for
  // step_scheduler.preemption_signal.
  std::unique_ptr<scheduling::PreemptionFlag> preemption;
};

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
};

// Runs (or resumes) the training run that `config` describes. Errors: kInvalidArgument naming
// the config field for bad values; kNotFound for missing data; the components' errors with
// what was being done; kUnavailable when a peer fails or times out.
[[nodiscard]] absl::StatusOr<TrainResult> Train(const TrainConfig& config, TrainRuntime runtime);

}  // namespace keel::tools

#endif  // KEEL_TOOLS_TRAINER_H_
