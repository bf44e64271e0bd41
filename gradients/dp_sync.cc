#include "gradients/dp_sync.h"

#include <utility>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/div.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "gradients/internal/grad_buckets.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::gradients {

using internal::Bucket;
using internal::GradBuckets;
using internal::GradBucketsOptions;
using internal::Piece;

absl::StatusOr<std::unique_ptr<DataParallelGradSync>> DataParallelGradSync::Create(
    std::vector<NamedParameter> parameters, c10d::ProcessGroup& group,
    const DataParallelGradSyncOptions& options) {
  return Make(std::move(parameters), &group, options);
}

absl::StatusOr<std::unique_ptr<DataParallelGradSync>> DataParallelGradSync::CreateLocal(
    std::vector<NamedParameter> parameters, const DataParallelGradSyncOptions& options) {
  if (!options.main_grad_dtype.has_value()) {
    return absl::InvalidArgumentError(
        "a gradient sync without a group holds main gradients: set main_grad_dtype");
  }
  return Make(std::move(parameters), nullptr, options);
}

absl::StatusOr<std::unique_ptr<DataParallelGradSync>> DataParallelGradSync::Make(
    std::vector<NamedParameter> parameters, c10d::ProcessGroup* group,
    const DataParallelGradSyncOptions& options) {
  GradBucketsOptions buckets_options;
  buckets_options.bucket_cap_mb = options.bucket_cap_mb;
  buckets_options.init_sync = options.init_sync;
  buckets_options.portions = 1;
  buckets_options.collective = "all-reduce";
  buckets_options.main_grad_dtype = options.main_grad_dtype;
  buckets_options.gradient_accumulation_fusion = options.gradient_accumulation_fusion;
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<GradBuckets> buckets,
                        GradBuckets::Create(std::move(parameters), group, buckets_options,
                                            [group](size_t, Bucket& bucket) {
                                              std::vector<at::Tensor> contents = {bucket.flat};
                                              return group->allreduce(contents);
                                            }));
  std::unique_ptr<DataParallelGradSync> sync(new DataParallelGradSync(std::move(buckets)));
  if (!options.main_grad_dtype.has_value()) return sync;
  // One piece per parameter (one part per bucket); a parameter without elements has none.
  const std::vector<at::Tensor>& params = sync->buckets_->params();
  for (const at::Tensor& param : params) {
    sync->main_grads_.push_back(
        at::zeros(param.sizes(), param.options().dtype(*options.main_grad_dtype)));
  }
  for (const Bucket& bucket : sync->buckets_->buckets()) {
    for (const Piece& piece : bucket.pieces) {
      sync->main_grads_[piece.param] = sync->buckets_->BucketRows(piece);
    }
  }
  return sync;
}

absl::StatusOr<std::unique_ptr<DataParallelGradSync>> DataParallelGradSync::Create(
    torch::nn::Module& module, c10d::ProcessGroup& group,
    const DataParallelGradSyncOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<DataParallelGradSync> sync,
                        Create(TrainableParameters({&module}), group, options));
  if (options.init_sync) {
    KEEL_RETURN_IF_ERROR(internal::BroadcastBuffersFromRank0(module, group));
  }
  return sync;
}

DataParallelGradSync::DataParallelGradSync(std::unique_ptr<GradBuckets> buckets)
    : buckets_(std::move(buckets)) {}

DataParallelGradSync::~DataParallelGradSync() = default;

void DataParallelGradSync::PrepareForGradAccumulation() { buckets_->EnableSync(false); }

void DataParallelGradSync::PrepareForFinalBackward() { buckets_->EnableSync(true); }

void DataParallelGradSync::SkipBackward() { buckets_->SkipBackward(); }

size_t DataParallelGradSync::num_buckets() const { return buckets_->buckets().size(); }

int64_t DataParallelGradSync::bucket_bytes() const { return buckets_->total_bytes(); }

at::Tensor DataParallelGradSync::LocalGradientSum() const { return buckets_->local_gradient_sum(); }

absl::Status DataParallelGradSync::Wait() {
  KEEL_RETURN_IF_ERROR(buckets_->Wait());
  at::NoGradGuard no_grad;
  const auto world = static_cast<double>(buckets_->world_size());
  return base::CallTorch(absl::StatusCode::kInternal, "writing the averaged gradients", [&] {
    if (buckets_->main_grads()) {
      if (world > 1) {
        for (Bucket& bucket : buckets_->buckets()) bucket.flat.div_(world);
      }
      return;
    }
    for (Bucket& bucket : buckets_->buckets()) {
      for (const Piece& piece : bucket.pieces) {
        at::Tensor grad =
            GradBuckets::Rows(internal::AllocatedGrad(buckets_->params()[piece.param]), piece);
        at::div_out(grad, buckets_->BucketRows(piece), world);
      }
    }
  });
}

}  // namespace keel::gradients
