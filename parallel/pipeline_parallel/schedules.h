// Pipeline parallelism after Megatron-Core's pipeline_parallel/schedules.py and
// p2p_communication.py: a model's layers split over the stages of a pipeline group, each
// micro-batch's activations sent forward stage by stage and their gradients back, in Megatron's
// one-forward-one-backward (1F1B) order: each stage runs forward passes to fill the pipeline
// (warm-up), then alternates one forward with one backward (steady state), then drains the
// backward passes (cool-down). A stage holds at most as many micro-batches' activations as
// there are stages after it, plus one.
//
//   keel::parallel::StageCallbacks stage;
//   stage.forward = [&](int64_t i, const at::Tensor& input) { ... };  // next stage's input
//   stage.activation_shape = [&](int64_t i) { return std::vector<int64_t>{b, s, h}; };
//   KEEL_RETURN_IF_ERROR(RunPipeline(num_micro_batches, stage, pp_group, options));
#ifndef KEEL_PARALLEL_PIPELINE_PARALLEL_SCHEDULES_H_
#define KEEL_PARALLEL_PIPELINE_PARALLEL_SCHEDULES_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

// The layers of one pipeline stage: [first, first + count).
struct StageLayers {
  int64_t first = 0;
  int64_t count = 0;
};

// Megatron's even split: stage s of `num_stages` holds layers [s x n / num_stages, ...) of n.
// Errors: kInvalidArgument, naming both numbers, when num_stages < 1, num_layers < num_stages
// (a stage would hold no layer), or num_layers is not a multiple of num_stages.
[[nodiscard]] absl::StatusOr<StageLayers> LayersOfStage(int64_t num_layers, int num_stages,
                                                        int stage);

// One step of a stage's schedule.
struct PipelineAction {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int64_t micro_batch = 0;

  friend bool operator==(const PipelineAction& a, const PipelineAction& b) {
    return a.kind == b.kind && a.micro_batch == b.micro_batch;
  }
};

// The order in which `stage` of `num_stages` runs `num_micro_batches` micro-batches
// (forward_backward_pipelining_without_interleaving): min(num_stages - stage - 1, m) forwards,
// then one forward and one backward for each remaining micro-batch, then the remaining
// backwards; forward_only: the m forwards. On one stage this is forward_backward_no_pipelining's
// order, a forward then its backward. Requires: 0 <= stage < num_stages, m >= 0.
std::vector<PipelineAction> OneFOneBSchedule(int64_t num_micro_batches, int stage, int num_stages,
                                             bool forward_only = false);

// What a stage computes.
struct StageCallbacks {
  // Micro-batch i's forward on this stage. `input` is the previous stage's activation
  // (received, requiring grad), undefined on the first stage. Returns the activation the next
  // stage receives (of activation_shape(i) and the options' dtype), or on the last stage the
  // scalar the backward pass starts from (the loss, scaled as the caller wants its
  // gradients). Throws c10::Error on failure, as LibTorch does.
  std::function<at::Tensor(int64_t i, const at::Tensor& input)> forward;
  // The shape of micro-batch i's activation between stages, known to both sides without an
  // exchange (Megatron's tensor_shape: micro-batch x sequence x hidden).
  std::function<std::vector<int64_t>(int64_t i)> activation_shape;
  // Called before micro-batch i's backward, if set (a data-parallel gradient sync that
  // overlaps the last backward prepares for it here). Default: none.
  std::function<void(int64_t i)> before_backward;
};

struct PipelineOptions {
  // dtype and device of the activations between stages. Default: float32 on the CPU.
  at::TensorOptions activation_options = at::TensorOptions().dtype(at::kFloat);
  // Forward passes only (validation): nothing is kept for a backward pass. Default: false.
  bool forward_only = false;
};

// Runs micro-batches 0..m-1 through this rank's stage in OneFOneBSchedule's order,
// accumulating parameter gradients as the stage's backward passes produce them. Between two
// passes it exchanges with the neighbouring ranks of `pp_group` as Megatron's schedule does
// (c10d point-to-point: Gloo on the CPU, NCCL on GPUs): an activation forward and an output
// gradient back in one exchange where a forward meets a backward, else the send and then the
// receive (their waits, the bubble included, count as CommKind::kPipeline: comm_timers.h);
// even stages post sends first, odd ones receives, and every exchange completes
// before the next pass. nullptr or a group of one: a single stage (a forward, then its
// backward, per micro-batch). Collective: every stage of the group calls it with the same m
// and shapes. An input the loss does not depend on sends back a zero gradient. Errors:
// kInternal when a forward or backward throws; kUnavailable when a peer fails or the group's
// timeout passes (a stage killed mid-step) over Gloo; over NCCL no error reaches this call: the
// device waits until the group's timeout, when PyTorch's NCCL watchdog ends the process;
// kInvalidArgument when pp_group does not carry the activations' device
// (base::CheckGroupCarries), or, before it is sent, when an activation is not of
// activation_shape and the options' dtype (naming both).
[[nodiscard]] absl::Status RunPipeline(int64_t num_micro_batches, const StageCallbacks& stage,
                                       c10d::ProcessGroup* pp_group,
                                       const PipelineOptions& options = {});

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_PIPELINE_PARALLEL_SCHEDULES_H_
