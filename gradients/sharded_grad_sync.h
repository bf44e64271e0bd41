// Sharded data-parallel gradient synchronisation: the communication of Megatron-Core's
// distributed optimizer (megatron/core/optimizer/distrib_optimizer.py; DeepSpeed ZeRO stage 2's
// reduce-scatter, with every rank's buckets whole as in stage 1).
// As DataParallelGradSync, gradients go into DDP's buckets from autograd hooks while backward
// runs, with accumulation micro-batches kept local; but each rank owns a contiguous part of
// every bucket and receives only the group average of that part (a reduce-scatter), steps only
// its parameter shards, and AllGather() then gives every rank every part's new values.
//
//   KEEL_ASSIGN_OR_RETURN(auto sync, ShardedGradSync::Create(*model, *dp_group));
//   sync->PrepareForFinalBackward();  // as DataParallelGradSync
//   loss.backward();
//   KEEL_RETURN_IF_ERROR(sync->Wait());  // each shard's grad() is its rows' average
//   ... step the shards (sync->shards()[i].tensor) ...
//   KEEL_RETURN_IF_ERROR(sync->AllGather());
#ifndef KEEL_GRADIENTS_SHARDED_GRAD_SYNC_H_
#define KEEL_GRADIENTS_SHARDED_GRAD_SYNC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "gradients/parameters.h"
#include "parallel/layout.h"
#include "torch/nn/module.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::gradients {
namespace internal {
class GradBuckets;
}  // namespace internal

// The rows of one parameter that this rank owns: rows [row_begin, row_begin + rows) of its
// dimension 0, none on some ranks.
struct ParamShard {
  // The parameter's fully qualified name.
  std::string name;
  // Those rows of the parameter: a view sharing its storage (not requiring grad), so stepping
  // it steps the parameter. Wait() sets its grad() (without main gradients).
  at::Tensor tensor;
  // With main gradients: this rank's rows of them, a view of the bucket in main_grad_dtype,
  // averaged over the group by Wait(). Undefined without main gradients.
  at::Tensor main_grad;
  // The shard in the whole tensor: the parameter's layout (none: the parameter is whole) with
  // one more dimension, the group's, sharding dimension 0, and the offset of these rows.
  parallel::TensorLayout layout;
  // Where the rows start in this rank's parameter tensor.
  int64_t row_begin = 0;
};

// Averages a module's gradients over a data-parallel group as DataParallelGradSync does, but
// delivers to each rank only the rows it owns. Each bucket's elements (see
// DataParallelGradSync) are cut into one contiguous part per rank, at the row boundary nearest
// to an equal split, so each rank's part of a parameter is a block of whole rows: a rank holds
// about 1/N of every bucket, within a row per part. The parts are padded to the largest, so
// NCCL reduce-scatters and all-gathers each bucket as one flat buffer; over Gloo the bucket is
// all-reduced and each rank keeps its part, the same sums, and each part is broadcast from its
// rank in place. With main gradients in another dtype than the parameters' (float32 for bf16),
// the parameters are all-gathered from buffers of their own dtype, as Megatron's separate
// parameter and gradient buffers.
//
// Requires: as DataParallelGradSync; no 0-d parameter (view it as shape [1]).
class ShardedGradSync {
 public:
  // Shards `parameters` over `group` (their layouts travel to the shards). Collective: every
  // rank calls it. Errors: DataParallelGradSync::Create's; kInvalidArgument for a 0-d
  // parameter.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardedGradSync>> Create(
      std::vector<NamedParameter> parameters, c10d::ProcessGroup& group,
      const DataParallelGradSyncOptions& options = {});
  // The module's trainable parameters, and with init_sync its buffers from rank 0.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardedGradSync>> Create(
      torch::nn::Module& module, c10d::ProcessGroup& group,
      const DataParallelGradSyncOptions& options = {});

  ShardedGradSync(const ShardedGradSync&) = delete;
  ShardedGradSync& operator=(const ShardedGradSync&) = delete;
  ~ShardedGradSync();

  // As DataParallelGradSync's.
  void PrepareForGradAccumulation();
  void PrepareForFinalBackward();
  void SkipBackward();

  // Finishes the synchronised backward: waits for every bucket's reduction and writes the
  // group average of this rank's rows into those rows of each parameter's grad, which each
  // shard's grad() then views (with main gradients: into the shards' main_grad). The
  // parameters' other rows of grad are this rank's local sums: read gradients through shards()
  // only. Collective. Errors: DataParallelGradSync::Wait's (naming the reduce-scatter).
  [[nodiscard]] absl::Status Wait();

  // After the shards were stepped (their rows of the parameters written): every rank's rows,
  // all-gathered into every rank's parameters, so the replicas are whole and equal again. `before`
  // is this rank's failure since Wait (a shard step that threw), if any. Every bucket is
  // all-gathered whatever failed, so the ranks' collectives stay paired, and the ranks then agree
  // on failure: a failing rank returns its error, its peers kAborted naming it. Collective. Errors:
  // `before`; kUnavailable when an all-gather fails, kInternal when copying rows does; kAborted on
  // the peers of a failing rank (the parameters are then unspecified).
  [[nodiscard]] absl::Status AllGather(const absl::Status& before = absl::OkStatus());

  // One shard per parameter, in the parameters' order (possibly without rows).
  const std::vector<ParamShard>& shards() const { return shards_; }
  // The parameters the shards are of, with their layouts.
  const std::vector<NamedParameter>& parameters() const;
  // The shards as ClipGradNorm's parameters, with their layouts (dimension 0 sharded over the
  // group), so that ClipGradNorm computes the norm of the whole averaged gradient.
  std::vector<NamedParameter> ShardParameters() const;

  // As DataParallelGradSync's: this rank's gradients, summed before the reduce-scatter.
  at::Tensor LocalGradientSum() const;

  size_t num_buckets() const;
  // Elements of the buckets (with the padding of the parts) and of this rank's parts.
  int64_t bucket_numel() const;
  int64_t shard_numel() const;

 private:
  explicit ShardedGradSync(std::unique_ptr<internal::GradBuckets> buckets);
  void MakeShards(const std::string& dim_name);

  std::unique_ptr<internal::GradBuckets> buckets_;
  int64_t rank_ = 0;
  bool native_ = false;  // the backend reduce-scatters and all-gathers flat buffers (NCCL)
  std::vector<ParamShard> shards_;
  // Each bucket's parameter buffer for the all-gather: the bucket itself when it has the
  // parameters' dtype.
  std::vector<at::Tensor> gather_buffers_;
};

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_SHARDED_GRAD_SYNC_H_
