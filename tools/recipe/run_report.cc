#include <chrono>
#include <ostream>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/files.h"
#include "base/status.h"
#include "c10/util/accumulate.h"
#include "tools/recipe/internal/run_state.h"
#include "tools/recipe/optimizer.h"
#include "tools/recipe/plot.h"
#include "tools/recipe/run.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::Status Run::OpenOutputs() {
  State& s = *state_;
  // Trainable tensors and parameters of the whole model (a LoRA run's adapters): each stage
  // counts its own, a shared copy not.
  at::Tensor counts = at::zeros({2}, at::kLong);
  for (const gradients::NamedParameter& p : s.optimizer->parameters()) {
    if (p.shared) continue;
    counts[0] += 1;
    counts[1] += p.layout ? c10::multiply_integers(p.layout->global_shape) : p.param.numel();
  }
  KEEL_RETURN_IF_ERROR(SumOverStages(counts, runtime_, "the parameter count"));
  if (runtime_.rank != 0) return absl::OkStatus();
  KEEL_ASSIGN_OR_RETURN(s.jsonl,
                        JsonlWriter::Create(base::JoinPath(options_.run_dir, "metrics.jsonl"),
                                            /*append=*/resumed_));
  if (options_.logging.tensorboard) {
    KEEL_ASSIGN_OR_RETURN(
        s.tensorboard,
        TensorBoardWriter::Create(base::JoinPath(options_.run_dir, "tensorboard"), NowSeconds()));
  }
  const int tp = base::GroupSize(runtime_.tensor_group());
  const int pp = base::GroupSize(runtime_.pipeline_group());
  const SampleShape shape = ShapeOf(options_, s.data.splits);
  *runtime_.log << "model: " << counts[0].item<int64_t>()
                << (options_.peft ? " LoRA adapter tensors (the rest frozen), " : " tensors, ")
                << counts[1].item<int64_t>() << " trainable parameters"
                << (tp > 1 ? absl::StrCat(" (1/", tp, " of most on each tensor-parallel rank",
                                          options_.distributed.sequence_parallel
                                              ? absl::StrCat(", and 1/", tp,
                                                             " of each sequence between its layers")
                                              : "",
                                          ")")
                           : "")
                << (pp > 1 ? absl::StrCat(" in ", pp, " pipeline stages of ",
                                          options_.model.num_layers / pp, " blocks")
                           : "")
                << ", " << s.optimizer->Describe()
                << (UsesFusedAdamW(options_.optimizer, runtime_.device) ? " (fused step)" : "")
                << "; " << s.data.splits.train_size() << " training and "
                << s.data.splits.val_size() << " validation " << shape.noun << " of "
                << shape.tokens << " tokens; " << s.scheduler->max_steps() << " steps of "
                << options_.step_scheduler.global_batch_size << " samples ("
                << s.scheduler->grad_acc_steps() << " micro-batches of "
                << options_.local_batch_size << " per rank on " << runtime_.dp_size
                << " rank(s))\n";
  return absl::OkStatus();
}

absl::Status Run::Record(const StepMetrics& metrics) {
  State& s = *state_;
  if (s.jsonl) KEEL_RETURN_IF_ERROR(s.jsonl->Write(metrics));
  if (!s.tensorboard) return absl::OkStatus();
  return AddStepScalars(*s.tensorboard, metrics, NowSeconds());
}

absl::StatusOr<TrainResult> Run::Finish() {
  State& s = *state_;
  s.Enter(Phase::kFinishing);
  KEEL_RETURN_IF_ERROR(s.checkpointer->Wait());
  s.watchdog.reset();
  KEEL_RETURN_IF_ERROR(s.scheduler->preemption_status());
  result_.preempted = s.scheduler->SigtermReceived();
  result_.final_step = s.scheduler->step();
  result_.loop_seconds = Seconds(Clock::now() - s.loop_start);
  result_.bookkeeping_seconds = Seconds(s.bookkeeping);
  result_.gradient_wait_seconds = Seconds(s.gradient_wait);
  s.counting.reset();
  result_.tensor_parallel_seconds = s.comm_timers.Seconds(parallel::CommKind::kTensorParallel);
  result_.pipeline_wait_seconds = s.comm_timers.Seconds(parallel::CommKind::kPipeline);
  result_.expert_dispatch_seconds = s.comm_timers.Seconds(parallel::CommKind::kExpertDispatch);
  if (runtime_.rank != 0) return result_;
  std::ostream& log = *runtime_.log;
  if (s.checkpointer->last_saved()) log << "checkpoint: " << *s.checkpointer->last_saved() << "\n";
  if (s.tensorboard) KEEL_RETURN_IF_ERROR(s.tensorboard->Flush());
  KEEL_ASSIGN_OR_RETURN(std::vector<StepMetrics> history,
                        ReadJsonl(base::JoinPath(options_.run_dir, "metrics.jsonl")));
  KEEL_RETURN_IF_ERROR(WriteLossPlot(base::JoinPath(options_.run_dir, "loss.svg"), history));
  log << (result_.preempted ? "preempted" : "done") << " at step " << result_.final_step
      << "; bookkeeping " << 100.0 * result_.bookkeeping_seconds / result_.loop_seconds << "% of "
      << result_.loop_seconds << " s; waiting for gradients "
      << 100.0 * result_.gradient_wait_seconds / result_.loop_seconds << "%";
  if (result_.tensor_parallel_seconds > 0) {
    log << "; tensor-parallel collectives "
        << 100.0 * result_.tensor_parallel_seconds / result_.loop_seconds << "%";
  }
  if (result_.expert_dispatch_seconds > 0) {
    log << "; expert dispatch " << 100.0 * result_.expert_dispatch_seconds / result_.loop_seconds
        << "%";
  }
  if (result_.pipeline_wait_seconds > 0) {
    log << "; pipeline waits " << 100.0 * result_.pipeline_wait_seconds / result_.loop_seconds
        << "%";
  }
  // On a GPU these are the host's times: collectives are queued there, not waited for.
  if (runtime_.device.is_cuda()) log << " (host times: the device runs asynchronously)";
  log << "\n";
  return result_;
}

}  // namespace keel::tools::recipe
