// What DataParallelGradSync and ShardedGradSync share: a module's trainable parameters in
// DDP's buckets, each bucket one flat buffer in `portions` equal parts of whole rows (1: the
// parameters packed, as DDP; the world size: one part per rank, each padded to the largest, so
// that a reduce-scatter gives rank r the sums of part r), gradients copied in from autograd
// hooks, and each bucket's collective launched, in bucket order on every rank, as soon as its
// last gradient arrived. With main gradients (Megatron's main_grad), the buffers are in their
// dtype and hold the gradients summed over every backward pass, accumulation micro-batches
// included; the parameters' own .grad is freed as soon as it was added in, and with
// gradient_accumulation_fusion each parameter's hook offers its rows to Keel's layers
// (parallel/main_grad.h), which add a weight's gradient there themselves.
#ifndef KEEL_GRADIENTS_INTERNAL_GRAD_BUCKETS_H_
#define KEEL_GRADIENTS_INTERNAL_GRAD_BUCKETS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradients/parameters.h"
#include "torch/csrc/distributed/c10d/Work.hpp"
#include "torch/nn/module.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d
namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace keel::gradients::internal {

// Rows [row_begin, row_begin + rows) of parameter `param` (its dimension 0; a 0-d parameter is
// one row), stored contiguously from element `offset` of its bucket's buffer, in part `portion`.
struct Piece {
  size_t param = 0;
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t offset = 0;
  int64_t portion = 0;
};

struct Bucket {
  // portions x portion_numel elements.
  at::Tensor flat;
  int64_t portion_numel = 0;
  // The parameters, and their pieces in bucket order.
  std::vector<size_t> params;
  std::vector<Piece> pieces;
  // The parameters' bytes (without padding).
  int64_t bytes = 0;
  // Parameters still waiting for their gradient in this backward.
  size_t pending = 0;
  c10::intrusive_ptr<c10d::Work> work;
};

struct GradBucketsOptions {
  // DataParallelGradSyncOptions' fields.
  double bucket_cap_mb = 25;
  bool init_sync = true;
  // Parts per bucket: 1 or the group's size.
  int64_t portions = 1;
  // The collective's name in messages ("all-reduce", "reduce-scatter").
  std::string collective = "all-reduce";
  // DataParallelGradSyncOptions::main_grad_dtype: the buffers' dtype, and every backward adds
  // into them. Unset: the parameters' dtype, filled by the synchronised backward only.
  std::optional<at::ScalarType> main_grad_dtype;
  // DataParallelGradSyncOptions::gradient_accumulation_fusion (with main gradients only).
  bool gradient_accumulation_fusion = false;
};

class GradBuckets {
 public:
  // Starts bucket `index`'s collective on its buffer. May throw c10::Error.
  using Launch = std::function<c10::intrusive_ptr<c10d::Work>(size_t index, Bucket& bucket)>;

  // DataParallelGradSync::Create's checks and errors, over `parameters` (each requiring grad,
  // each tensor once), whose layouts travel with them; the hooks call `launch`. With init_sync,
  // rank 0's values of the parameters are broadcast. Collective: every rank of `group` calls it.
  // A null `group` (one rank, main gradients only) launches nothing.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GradBuckets>> Create(
      std::vector<NamedParameter> parameters, c10d::ProcessGroup* group,
      const GradBucketsOptions& options, Launch launch);

  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;
  // Removes the gradient hooks; collectives in flight are abandoned.
  ~GradBuckets();

  // Whether the following backward passes fill the buckets (else they only accumulate).
  void EnableSync(bool enabled) { sync_enabled_.store(enabled); }
  // DataParallelGradSync::SkipBackward: every parameter still waiting for its gradient gets
  // what this rank accumulated (zeros if nothing), and its bucket's collective launches.
  void SkipBackward();

  // DataParallelGradSync::Wait up to the averaging: every bucket's collective is awaited (a
  // parameter without gradient contributes zeros, and an error), then the ranks agree on
  // failure (base::AgreeOnFailure), so a rank's error reaches its peers. Collective.
  [[nodiscard]] absl::Status Wait();

  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Requires: a group.
  c10d::ProcessGroup& group() const { return *group_; }
  int64_t world_size() const;
  bool main_grads() const { return main_grads_; }
  // DataParallelGradSync::LocalGradientSum; without a group, the buffers summed when asked.
  at::Tensor local_gradient_sum() const;
  int64_t total_bytes() const { return total_bytes_; }

  // The piece's rows in its bucket's buffer, shaped as the parameter's rows.
  at::Tensor BucketRows(const Piece& piece);
  // The piece's rows in `flat`, a buffer laid out as the piece's bucket.
  at::Tensor BucketRows(const Piece& piece, const at::Tensor& flat);
  // The piece's rows of `tensor` (the parameter, or its gradient).
  static at::Tensor Rows(const at::Tensor& tensor, const Piece& piece);

 private:
  GradBuckets(c10d::ProcessGroup* group, std::vector<NamedParameter> parameters, Launch launch,
              const GradBucketsOptions& options);
  [[nodiscard]] absl::Status AssignBuckets(double bucket_cap_mb, int64_t portions);
  void LayOut(Bucket& bucket, int64_t portions, at::ScalarType dtype);
  [[nodiscard]] absl::Status CheckRanksAgree();
  [[nodiscard]] absl::Status BroadcastFromRank0();
  void RegisterHooks();
  void OnGradient(size_t index, const at::Tensor& grad);
  [[nodiscard]] absl::Status AddGradientLocked(size_t index, const at::Tensor& grad);
  // Main gradients: after the parameter's AccumulateGrad, its .grad is added to its rows and
  // freed.
  void OnAccumulated(size_t index);
  // parallel::MainGrad::AddWeightGradient for parameter `index`: grad_output^T input into its
  // rows, before its AccumulateGrad (which then has no gradient to accumulate).
  void AddWeightGradient(size_t index, const at::Tensor& grad_output, const at::Tensor& input);
  // Calls `write` with each of the parameter's pieces and its rows in the bucket; a throw
  // becomes kInternal, described by `what`.
  [[nodiscard]] absl::Status ForEachPieceLocked(
      size_t index, const std::string& what,
      const std::function<void(const Piece&, at::Tensor&)>& write);
  // ForEachPieceLocked's description of adding to the parameter's main gradient.
  std::string MainGradientWrite(size_t index) const;
  [[nodiscard]] absl::Status AddMainGradientLocked(size_t index);
  [[nodiscard]] absl::Status ZeroPiecesLocked(size_t index);
  // kFailedPrecondition naming the parameter.
  [[nodiscard]] absl::Status SecondGradientError(size_t index) const;
  // kInvalidArgument naming the parameter.
  [[nodiscard]] absl::Status SparseGradientError(size_t index) const;
  // The gradient accumulated so far into the parameter's pieces: .grad's (zeros without one),
  // or with main gradients what the buckets hold already.
  [[nodiscard]] absl::Status TakeAccumulatedLocked(size_t index);
  void MarkReadyLocked(size_t index);
  void LaunchReadyBucketsLocked();

  c10d::ProcessGroup* group_;
  const std::vector<NamedParameter> parameters_;
  const std::vector<std::string> names_;
  const std::vector<at::Tensor> params_;
  const Launch launch_;
  const std::string collective_;
  const bool main_grads_;
  const bool fuse_weight_gradients_;
  std::vector<Bucket> buckets_;
  // For each parameter: its bucket and its pieces' indices there.
  std::vector<size_t> bucket_of_;
  std::vector<std::vector<size_t>> pieces_of_;
  std::vector<unsigned> hook_handles_;
  // Main gradients: each parameter's gradient accumulator (kept alive: the parameter holds it
  // weakly) and the key of the hook on it.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> accumulator_hooks_;
  int64_t total_bytes_ = 0;

  std::atomic<bool> sync_enabled_{true};
  std::mutex mu_;  // guards the per-backward state below, written by autograd hooks
  std::vector<bool> ready_;
  // Main gradients: whether the parameter's rows hold a gradient of this step (else the next
  // one is copied in, not added).
  std::vector<bool> accumulated_;
  // Main gradients: whether a layer added the parameter's gradient in this backward
  // (AddWeightGradient), so that its AccumulateGrad counts as its arrival.
  std::vector<bool> added_;
  size_t num_ready_ = 0;
  size_t next_bucket_ = 0;  // buckets are launched in index order on every rank
  absl::Status hook_status_;
  // The float64 sum of the launched buckets' local gradients, and that of the last Wait.
  at::Tensor pending_sum_;
  at::Tensor local_sum_;
};

// A parameter's .grad, allocated (zeros) where it has none (a rank that skipped its backward):
// where a sync's Wait writes the average. May throw c10::Error.
at::Tensor& AllocatedGrad(const at::Tensor& param);

// Broadcasts rank 0's buffers of `module` (running statistics and the like) to every rank of
// `group`. Collective. Errors: kUnavailable when a broadcast fails.
[[nodiscard]] absl::Status BroadcastBuffersFromRank0(torch::nn::Module& module,
                                                     c10d::ProcessGroup& group);

}  // namespace keel::gradients::internal

#endif  // KEEL_GRADIENTS_INTERNAL_GRAD_BUCKETS_H_
