// What the trainer logs after each optimizer step: StepMetrics, written as JSONL (one object a
// line, read back across resumes) and as a progress line in the shape of Megatron's
// training_log (megatron/training/training.py). TensorBoard events are in tensorboard.h, the
// loss plot in plot.h.
//
//   KEEL_ASSIGN_OR_RETURN(auto jsonl, JsonlWriter::Create(jsonl_path, /*append=*/resumed));
//   KEEL_RETURN_IF_ERROR(jsonl.Write(m));
//   std::cout << ProgressLine(m, max_steps, /*start_step=*/resumed_step) << "\n";
//   KEEL_ASSIGN_OR_RETURN(std::vector<StepMetrics> history, ReadJsonl(jsonl_path));
#ifndef KEEL_TOOLS_RECIPE_METRICS_H_
#define KEEL_TOOLS_RECIPE_METRICS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "base/files.h"

namespace keel::tools::recipe {

// What the training loop logs after an optimizer step. Field names are the JSONL keys.
struct StepMetrics {
  // Optimizer steps completed, counting those before a resume.
  int64_t step = 0;
  // The epoch the step belongs to, from 0.
  int64_t epoch = 0;
  // Training loss of the step (mean over its micro-batches and ranks).
  double loss = 0.0;
  // Learning rate the step used.
  double lr = 0.0;
  // Total gradient norm before clipping.
  double grad_norm = 0.0;
  // Training throughput over the last logging interval, all ranks together: on the steps with a
  // progress line (every logging.log_every_steps, and validation steps), null on the others.
  std::optional<double> tokens_per_second;
  // Rank 0's most bytes of live tensors on its device at once over the same interval, in GiB
  // (torch.cuda.max_memory_allocated, reset each interval: AutoModel's `mem`; on the CPU as
  // base/tensor_memory.h counts them): on the steps with a progress line, null on the others.
  std::optional<double> max_memory_allocated_gib;
  // Wall-clock seconds since this process started training (it restarts at 0 on resume).
  double elapsed_seconds = 0.0;
  // Validation loss, for steps that ran validation.
  std::optional<double> val_loss;
  // Steps skipped so far for a non-finite loss or gradient norm (numerics.on_nonfinite
  // "skip" only).
  std::optional<int64_t> skipped_steps;
  // Mixture of experts only: the step's load-balancing loss (every MoE block's, summed, and
  // averaged over the micro-batches of every rank) and the tokens routed to each expert
  // (summed over the blocks, micro-batches and data-parallel ranks).
  std::optional<double> moe_aux_loss;
  std::optional<std::vector<int64_t>> tokens_per_expert;
  // The first step after the launcher restarted the workers (tools:launch --max_restarts):
  // how many times it has, and why it did the last time.
  std::optional<int64_t> restart_count;
  std::optional<std::string> restart_cause;
  // The first step of a run that resumed: the step of the checkpoint it resumed from. The
  // file's earlier rows from that step on belong to steps the resume abandoned (after a crash,
  // or a newer checkpoint set aside); ReadJsonl drops them.
  std::optional<int64_t> resumed_from_step;
};

template <typename O, typename V, base::IsFieldsOf<O, StepMetrics> = 0>
void VisitFields(O& o, V&& v) {
  v("step", o.step);
  v("epoch", o.epoch);
  v("loss", o.loss);
  v("lr", o.lr);
  v("grad_norm", o.grad_norm);
  v("tokens_per_second", o.tokens_per_second);
  v("max_memory_allocated_gib", o.max_memory_allocated_gib);
  v("elapsed_seconds", o.elapsed_seconds);
  v("val_loss", o.val_loss);
  v("skipped_steps", o.skipped_steps);
  v("moe_aux_loss", o.moe_aux_loss);
  v("tokens_per_expert", o.tokens_per_expert);
  v("restart_count", o.restart_count);
  v("restart_cause", o.restart_cause);
  v("resumed_from_step", o.resumed_from_step);
}

// Appends StepMetrics to a JSONL file, one JSON object per line in VisitFields order. Doubles
// are written in the shortest form that reads back to the same value; non-finite ones are the
// strings "nan", "inf", "-inf", and an absent val_loss is null.
class JsonlWriter {
 public:
  // Opens `path`, truncating it, or with `append` continuing it; a partial last line (a crash
  // in mid-write) is cut off first so the file stays valid JSONL.
  // Errors: base::ErrnoCode's (kNotFound for a missing directory, kPermissionDenied, ...)
  // with a message naming `path`.
  [[nodiscard]] static absl::StatusOr<JsonlWriter> Create(const std::string& path, bool append);

  // Writes one line with a single write(2), so it is in the file (not in a user-space buffer)
  // when this returns. Errors: as Create's, e.g. kResourceExhausted for a full disk.
  [[nodiscard]] absl::Status Write(const StepMetrics& metrics);

  const std::string& path() const { return path_; }

 private:
  JsonlWriter(std::string path, base::UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  base::UniqueFd fd_;
};

// Reads a file that JsonlWriter wrote. A record whose step is not above the previous one's
// starts a resumed run: the records it replays (those at or after its step) are dropped, so
// the result has strictly increasing steps. Blank lines are skipped, and so is a last line that
// has no newline and does not parse (a write cut short by a crash).
// Errors: base::ErrnoCode's if `path` cannot be read; kDataLoss naming the path
// and line for a line that is not a JSON object with every field of StepMetrics (val_loss
// may be absent or null).
[[nodiscard]] absl::StatusOr<std::vector<StepMetrics>> ReadJsonl(const std::string& path);

// One progress line, e.g.
//   step   120/1000 | loss 2.3412 | lr 3.00e-04 | grad norm 0.812 | 15.2k tok/s | ETA 1m58s
// with "| mem X GiB" (max_memory_allocated_gib) and "| val loss X" added when present. The ETA
// extrapolates elapsed_seconds over the `metrics.step - start_step` steps this process ran
// (`start_step`: the step it resumed from); it is "ETA --" before any step, and left out when
// max_steps <= 0.
std::string ProgressLine(const StepMetrics& metrics, int64_t max_steps, int64_t start_step = 0);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_METRICS_H_
