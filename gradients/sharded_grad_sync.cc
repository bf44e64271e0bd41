#include "gradients/sharded_grad_sync.h"

#include <utility>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/div.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "gradients/internal/grad_buckets.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Types.hpp"
#include "torch/csrc/distributed/c10d/Work.hpp"

namespace keel::gradients {
namespace {

using internal::Bucket;
using internal::GradBuckets;
using internal::GradBucketsOptions;
using internal::Piece;

// Rank `rank`'s part of `flat`, the bucket's buffer or one laid out as it.
at::Tensor Part(const Bucket& bucket, const at::Tensor& flat, int64_t rank) {
  return flat.narrow(0, rank * bucket.portion_numel, bucket.portion_numel);
}

// Starts the reduction of the bucket's parts: a reduce-scatter where the backend has one for
// flat buffers (NCCL), else an all-reduce (Gloo), after which rank `rank`'s part holds the same
// sums. May throw c10::Error.
c10::intrusive_ptr<c10d::Work> ReduceScatter(c10d::ProcessGroup& group, Bucket& bucket,
                                             int64_t rank, bool native) {
  if (native) {
    at::Tensor part = Part(bucket, bucket.flat, rank);
    return group._reduce_scatter_base(part, bucket.flat);
  }
  std::vector<at::Tensor> contents = {bucket.flat};
  return group.allreduce(contents);
}

// Starts the all-gather of every rank's part of `flat` (laid out as the bucket) into the whole
// buffer, in place: one flat all-gather (NCCL), or each part broadcast from its rank (Gloo,
// whose all-gather would stage the whole bucket in a second buffer). May throw c10::Error.
std::vector<c10::intrusive_ptr<c10d::Work>> AllGatherParts(c10d::ProcessGroup& group,
                                                           const Bucket& bucket, at::Tensor flat,
                                                           int64_t rank, bool native) {
  if (native) {
    at::Tensor mine = Part(bucket, flat, rank);
    return {group._allgather_base(flat, mine)};
  }
  std::vector<c10::intrusive_ptr<c10d::Work>> work;
  for (int64_t k = 0; k < group.getSize(); ++k) {
    std::vector<at::Tensor> part = {Part(bucket, flat, k)};
    c10d::BroadcastOptions from;
    from.rootRank = k;
    work.push_back(group.broadcast(part, from));
  }
  return work;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardedGradSync>> ShardedGradSync::Create(
    std::vector<NamedParameter> parameters, c10d::ProcessGroup& group,
    const DataParallelGradSyncOptions& options) {
  for (const NamedParameter& p : parameters) {
    if (p.param.defined() && p.param.dim() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name,
                       "' is 0-dimensional; shards are blocks of rows (dimension 0): register it "
                       "with shape [1]"));
    }
  }
  const int64_t rank = group.getRank();
  const bool native = group.getBackendName() == "nccl";
  GradBucketsOptions buckets_options;
  buckets_options.bucket_cap_mb = options.bucket_cap_mb;
  buckets_options.init_sync = options.init_sync;
  buckets_options.portions = group.getSize();
  buckets_options.collective = "reduce-scatter";
  buckets_options.main_grad_dtype = options.main_grad_dtype;
  buckets_options.gradient_accumulation_fusion = options.gradient_accumulation_fusion;
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<GradBuckets> buckets,
                        GradBuckets::Create(std::move(parameters), &group, buckets_options,
                                            [&group, rank, native](size_t, Bucket& bucket) {
                                              return ReduceScatter(group, bucket, rank, native);
                                            }));
  std::unique_ptr<ShardedGradSync> sync(new ShardedGradSync(std::move(buckets)));
  sync->rank_ = rank;
  sync->native_ = native;
  sync->MakeShards(options.dim_name);
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kInternal, "allocating the parameter all-gather buffers", [&] {
        for (const Bucket& bucket : sync->buckets_->buckets()) {
          const at::ScalarType dtype =
              sync->buckets_->params()[bucket.params.front()].scalar_type();
          sync->gather_buffers_.push_back(
              dtype == bucket.flat.scalar_type()
                  ? bucket.flat
                  : at::empty_like(bucket.flat, bucket.flat.options().dtype(dtype)));
        }
      }));
  return sync;
}

absl::StatusOr<std::unique_ptr<ShardedGradSync>> ShardedGradSync::Create(
    torch::nn::Module& module, c10d::ProcessGroup& group,
    const DataParallelGradSyncOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<ShardedGradSync> sync,
                        Create(TrainableParameters({&module}), group, options));
  if (options.init_sync) {
    KEEL_RETURN_IF_ERROR(internal::BroadcastBuffersFromRank0(module, group));
  }
  return sync;
}

ShardedGradSync::ShardedGradSync(std::unique_ptr<GradBuckets> buckets)
    : buckets_(std::move(buckets)) {}

ShardedGradSync::~ShardedGradSync() = default;

// A parameter's shard starts after the rows of the lower ranks' parts.
void ShardedGradSync::MakeShards(const std::string& dim_name) {
  const std::vector<NamedParameter>& parameters = buckets_->parameters();
  std::vector<int64_t> row_begin(parameters.size(), 0), rows(parameters.size(), 0);
  for (const Bucket& bucket : buckets_->buckets()) {
    for (const Piece& piece : bucket.pieces) {
      if (piece.portion < rank_) row_begin[piece.param] += piece.rows;
      if (piece.portion == rank_) rows[piece.param] = piece.rows;
    }
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const NamedParameter& p = parameters[i];
    parallel::TensorLayout layout;
    if (p.layout) {
      layout = *p.layout;
    } else {
      layout.global_shape = p.param.sizes().vec();
      layout.offsets.assign(layout.global_shape.size(), 0);
    }
    layout.dims.push_back({dim_name, &buckets_->group(), parallel::Placement::Shard(0)});
    layout.offsets[0] += row_begin[i];
    ParamShard shard{p.name,
                     p.param.detach().narrow(0, row_begin[i], rows[i]),
                     {},
                     std::move(layout),
                     row_begin[i]};
    if (buckets_->main_grads()) {
      shard.main_grad = at::empty_like(shard.tensor, buckets_->buckets().front().flat.options());
    }
    shards_.push_back(std::move(shard));
  }
  if (!buckets_->main_grads()) return;
  for (const Bucket& bucket : buckets_->buckets()) {
    for (const Piece& piece : bucket.pieces) {
      if (piece.portion == rank_) shards_[piece.param].main_grad = buckets_->BucketRows(piece);
    }
  }
}

void ShardedGradSync::PrepareForGradAccumulation() { buckets_->EnableSync(false); }

void ShardedGradSync::PrepareForFinalBackward() { buckets_->EnableSync(true); }

void ShardedGradSync::SkipBackward() { buckets_->SkipBackward(); }

size_t ShardedGradSync::num_buckets() const { return buckets_->buckets().size(); }

at::Tensor ShardedGradSync::LocalGradientSum() const { return buckets_->local_gradient_sum(); }

int64_t ShardedGradSync::bucket_numel() const {
  int64_t numel = 0;
  for (const Bucket& bucket : buckets_->buckets()) numel += bucket.flat.numel();
  return numel;
}

int64_t ShardedGradSync::shard_numel() const {
  int64_t numel = 0;
  for (const ParamShard& shard : shards_) numel += shard.tensor.numel();
  return numel;
}

const std::vector<NamedParameter>& ShardedGradSync::parameters() const {
  return buckets_->parameters();
}

std::vector<NamedParameter> ShardedGradSync::ShardParameters() const {
  std::vector<NamedParameter> parameters;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ParamShard& shard = shards_[i];
    const NamedParameter& whole = buckets_->parameters()[i];
    parameters.push_back(
        {shard.name, shard.tensor, shard.layout, whole.shared, whole.shared_embedding});
  }
  return parameters;
}

absl::Status ShardedGradSync::Wait() {
  KEEL_RETURN_IF_ERROR(buckets_->Wait());
  at::NoGradGuard no_grad;
  const double world = buckets_->group().getSize();
  const std::vector<at::Tensor>& params = buckets_->params();
  return base::CallTorch(absl::StatusCode::kInternal, "writing the averaged gradients", [&] {
    if (buckets_->main_grads()) {
      for (ParamShard& shard : shards_) shard.main_grad.div_(world);
      return;
    }
    for (Bucket& bucket : buckets_->buckets()) {
      for (const Piece& piece : bucket.pieces) {
        if (piece.portion != rank_) continue;
        at::Tensor grad = GradBuckets::Rows(internal::AllocatedGrad(params[piece.param]), piece);
        at::div_out(grad, buckets_->BucketRows(piece), world);
      }
    }
    for (size_t i = 0; i < shards_.size(); ++i) {
      ParamShard& shard = shards_[i];
      const at::Tensor& grad = params[i].grad();
      shard.tensor.mutable_grad() =
          grad.defined() ? grad.narrow(0, shard.row_begin, shard.tensor.size(0)) : at::Tensor();
    }
  });
}

absl::Status ShardedGradSync::AllGather(const absl::Status& before) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor>& params = buckets_->params();
  std::vector<Bucket>& buckets = buckets_->buckets();
  // Every bucket's all-gather is launched and awaited whatever failed before it, so that the
  // ranks' collectives stay paired; the first failure is kept and agreed on at the end.
  absl::Status status = before;
  auto keep_first = [&status](absl::Status s) {
    if (status.ok()) status = std::move(s);
  };
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> work(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    keep_first(base::CallTorch(absl::StatusCode::kInternal,
                               absl::StrCat("copying this rank's rows into parameter bucket ", b),
                               [&] {
                                 for (const Piece& piece : bucket.pieces) {
                                   if (piece.portion != rank_) continue;
                                   buckets_->BucketRows(piece, gather_buffers_[b])
                                       .copy_(GradBuckets::Rows(params[piece.param], piece));
                                 }
                               }));
    keep_first(base::CallTorch(
        absl::StatusCode::kUnavailable, absl::StrCat("all-gather of parameter bucket ", b), [&] {
          work[b] = AllGatherParts(buckets_->group(), bucket, gather_buffers_[b], rank_, native_);
        }));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    Bucket& bucket = buckets[b];
    keep_first(base::CallTorch(
        absl::StatusCode::kUnavailable,
        absl::StrCat("all-gather of parameter bucket ", b, " (", bucket.bytes, " bytes)"), [&] {
          for (const auto& part : work[b]) part->wait();
          for (const Piece& piece : bucket.pieces) {
            if (piece.portion != rank_) {
              GradBuckets::Rows(params[piece.param], piece)
                  .copy_(buckets_->BucketRows(piece, gather_buffers_[b]));
            }
          }
        }));
  }
  return base::AgreeOnFailure(status, buckets_->group(), params.front().device(),
                              "the parameter all-gather");
}

}  // namespace keel::gradients
