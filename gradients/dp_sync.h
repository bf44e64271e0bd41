// Data-parallel gradient synchronisation with gradient accumulation, the C++ counterpart of
// NeMo AutoModel's prepare_for_grad_accumulation / prepare_for_final_backward
// (nemo_automodel/components/training/utils.py) over a DDP-style replica: backward passes
// after PrepareForGradAccumulation() only accumulate locally; the backward after
// PrepareForFinalBackward() averages the gradients over the group in buckets whose
// all-reduce starts from gradient hooks while backward is still running, as PyTorch DDP does.
//
// Not c10d's Reducer, whose constructor is internal to PyTorch and changes between versions:
// the buckets are Keel's own, filled from Tensor::register_hook.
//
//   KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(*model, *dp_group));
//   sync->PrepareForGradAccumulation();
//   for (int i = 0; i < grad_acc_steps; ++i) {
//     if (i == grad_acc_steps - 1) sync->PrepareForFinalBackward();
//     (Loss(model->forward(inputs[i])) / grad_acc_steps).backward();
//   }
//   KEEL_RETURN_IF_ERROR(sync->Wait());  // then optimizer.step()
#ifndef KEEL_GRADIENTS_DP_SYNC_H_
#define KEEL_GRADIENTS_DP_SYNC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradients/parameters.h"
#include "torch/nn/module.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::gradients {
namespace internal {
class GradBuckets;
}  // namespace internal

// Mirrors the DistributedDataParallel arguments that matter without Python: same names and
// defaults.
struct DataParallelGradSyncOptions {
  // Target size of one all-reduce bucket, in MiB; the first bucket (the last parameters, whose
  // gradients arrive first) is capped at 1 MiB as in DDP. Default: 25.
  double bucket_cap_mb = 25;
  // Broadcast rank 0's parameters and buffers to every rank in Create. Default: true.
  bool init_sync = true;
  // Keel: the mesh dimension the group is, as the shards' layouts name it ("dp", "expert_dp").
  // Default: "dp".
  std::string dim_name = "dp";
  // Megatron's main gradients (DistributedDataParallel's main_grad buffers): every backward
  // pass, accumulation micro-batches included, adds each parameter's gradient into a buffer of
  // this dtype and frees the parameter's .grad; the buffers are reduced in this dtype (float32
  // for bf16 parameters: Megatron's grad_reduce_in_fp32), and Wait() leaves the average there
  // (MainGrad), not in .grad. Default: unset (DDP's: gradients accumulate in .grad).
  std::optional<at::ScalarType> main_grad_dtype;
  // Megatron's gradient_accumulation_fusion (ModelParallelConfig's), with main gradients only:
  // Keel's linear layers add their weights' gradients into the main gradients from the
  // weight-gradient product itself (parallel/main_grad.h), on a GPU in float32 from bf16
  // inputs, and hand autograd no .grad for them. Default: true (Megatron's training default).
  bool gradient_accumulation_fusion = true;
};

// Averages the gradients of a module's parameters over a data-parallel process group once per
// optimizer step. Only dense floating-point parameters that require grad are synchronised;
// every one of them must receive a gradient in the synchronised backward (no unused
// parameters, no sparse gradients: both are errors reported by Wait()).
//
// Requires: `module` and `group` outlive this object; every rank of `group` holds a replica
// with the same parameters (names, shapes, dtypes, order) and calls Create, the Prepare*
// methods, backward and Wait in the same order.
class DataParallelGradSync {
 public:
  // Averages `parameters` over `group`: part of a model whose gradients reduce over one group
  // (the dense parameters over dp, the experts over expert dp). Assigns them to buckets, checks
  // that the ranks agree on them and, with init_sync, copies rank 0's values to the others.
  // Collective: every rank calls it.
  // Errors: kInvalidArgument for bad options, no parameters, one that does not require grad or
  // is listed twice, sparse or non-floating-point parameters, or ranks whose parameters differ;
  // kUnavailable when a collective fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallelGradSync>> Create(
      std::vector<NamedParameter> parameters, c10d::ProcessGroup& group,
      const DataParallelGradSyncOptions& options = {});
  // The whole module: its trainable parameters (TrainableParameters) over `group`, and with
  // init_sync its buffers from rank 0 too. Collective. Errors: as above.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallelGradSync>> Create(
      torch::nn::Module& module, c10d::ProcessGroup& group,
      const DataParallelGradSyncOptions& options = {});
  // One rank, no group: the main gradients alone (options.main_grad_dtype must be set), as
  // Megatron keeps them on one data-parallel rank; Wait() communicates nothing.
  // Errors: as Create's; kInvalidArgument without main_grad_dtype.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallelGradSync>> CreateLocal(
      std::vector<NamedParameter> parameters, const DataParallelGradSyncOptions& options);

  DataParallelGradSync(const DataParallelGradSync&) = delete;
  DataParallelGradSync& operator=(const DataParallelGradSync&) = delete;
  // Removes the gradient hooks. Reductions still in flight are abandoned, not awaited.
  ~DataParallelGradSync();

  // Following backward passes accumulate gradients locally, with no communication.
  void PrepareForGradAccumulation();
  // The next backward pass reduces gradients over the group; call Wait() after it. This is
  // the state after Create, so without accumulation every backward is synchronised.
  void PrepareForFinalBackward();
  // Instead of the synchronised backward, on a rank that has no (further) micro-batch in this
  // step (an epoch's short last step without drop_last): the collectives start with what this
  // rank accumulated, zeros if nothing, as the ranks joined by DDP's join() shadow their
  // peers' all-reduces. Call Wait() after it.
  void SkipBackward();

  // Finishes the synchronised backward: waits for every bucket's all-reduce and writes the
  // group average (sum / world size) into each parameter's grad (with main gradients, into
  // MainGrad), identical on every rank.
  // Collective: all buckets are reduced even on error, so the ranks stay in step.
  // Errors: kFailedPrecondition when called in accumulation mode with nothing pending, or when a
  // parameter got no gradient (unused) or two (two backward passes before Wait); the message
  // names the parameter. kInvalidArgument for a sparse gradient. kUnavailable when an
  // all-reduce fails (peer lost, timeout). After an error the gradients are unspecified.
  [[nodiscard]] absl::Status Wait();

  // The float64 sum of this rank's own gradients in the last synchronised backward, before
  // the reduction: a 0-d tensor on the parameters' device (no host synchronisation), non-finite
  // exactly when one of them was (float32 and narrower gradients cannot overflow it). It tells
  // which rank a non-finite reduced gradient came from, as Megatron's check_for_nan_in_grad
  // checks each rank's local gradients; undefined before the first Wait(). Without a group it
  // is summed when asked, not on every step.
  at::Tensor LocalGradientSum() const;

  // With main gradients: parameter i's (in the given order), a view of its bucket in
  // main_grad_dtype with the parameter's shape; the group's average after Wait(), overwritten
  // by the next step's first backward. Undefined without main gradients.
  const at::Tensor& MainGrad(size_t i) const { return main_grads_[i]; }

  // Number of all-reduce buckets, each reduced by one collective per synchronised backward.
  size_t num_buckets() const;
  // Bytes all-reduced per synchronised backward (the parameters' total size).
  int64_t bucket_bytes() const;

 private:
  explicit DataParallelGradSync(std::unique_ptr<internal::GradBuckets> buckets);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DataParallelGradSync>> Make(
      std::vector<NamedParameter> parameters, c10d::ProcessGroup* group,
      const DataParallelGradSyncOptions& options);

  std::unique_ptr<internal::GradBuckets> buckets_;
  std::vector<at::Tensor> main_grads_;
};

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_DP_SYNC_H_
