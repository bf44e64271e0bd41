#include "gradients/internal/grad_buckets.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/add.h"
#include "ATen/ops/empty.h"
#include "ATen/ops/tensor.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "parallel/main_grad.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/function_hook.h"
#include "torch/csrc/autograd/variable.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Types.hpp"

namespace keel::gradients::internal {
namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;
// DDP's _DEFAULT_FIRST_BUCKET_BYTES: a small first bucket starts communication early.
constexpr int64_t kFirstBucketBytes = 1024 * 1024;

// FNV-1a over the values, folded to 62 bits so that it can be negated in an int64 tensor.
int64_t Fingerprint(const std::vector<int64_t>& values) {
  uint64_t hash = 14695981039346656037ull;
  for (int64_t value : values) {
    hash ^= static_cast<uint64_t>(value);
    hash *= 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 2);
}

// A parameter's rows (dimension 0; a 0-d parameter is one row) and elements per row.
int64_t RowCount(const at::Tensor& param) { return param.dim() == 0 ? 1 : param.size(0); }
int64_t RowWidth(const at::Tensor& param) {
  int64_t width = 1;
  for (int64_t d = 1; d < param.dim(); ++d) width *= param.size(d);
  return width;
}

std::vector<std::string> NamesOf(const std::vector<NamedParameter>& parameters) {
  std::vector<std::string> names;
  for (const NamedParameter& p : parameters) names.push_back(p.name);
  return names;
}

std::vector<at::Tensor> TensorsOf(const std::vector<NamedParameter>& parameters) {
  std::vector<at::Tensor> tensors;
  for (const NamedParameter& p : parameters) tensors.push_back(p.param);
  return tensors;
}

// Runs after a parameter's AccumulateGrad node, which has just written its .grad (or had
// nothing to write: a layer added the gradient to the main gradient itself).
class AfterAccumulation : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulation(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// The same hook offering the parameter's main gradient to the layers (gradient accumulation
// fusion).
class OfferingMainGrad : public AfterAccumulation, public parallel::MainGrad {
 public:
  using Add = std::function<void(const at::Tensor&, const at::Tensor&)>;
  OfferingMainGrad(std::function<void()> fn, Add add)
      : AfterAccumulation(std::move(fn)), add_(std::move(add)) {}
  void AddWeightGradient(const at::Tensor& grad_output, const at::Tensor& input) override {
    add_(grad_output, input);
  }

 private:
  Add add_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradBuckets>> GradBuckets::Create(
    std::vector<NamedParameter> parameters, c10d::ProcessGroup* group,
    const GradBucketsOptions& options, Launch launch) {
  if (!(options.bucket_cap_mb > 0) || !std::isfinite(options.bucket_cap_mb)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket_cap_mb must be a finite number > 0, got ", options.bucket_cap_mb));
  }
  if (options.main_grad_dtype.has_value() && !at::isFloatingType(*options.main_grad_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("main_grad_dtype must be a floating-point dtype, got ",
                     c10::toString(*options.main_grad_dtype)));
  }
  TORCH_INTERNAL_ASSERT(group != nullptr || options.main_grad_dtype.has_value(),
                        "gradient buckets without a group hold main gradients");
  std::unordered_set<const void*> seen;
  for (const NamedParameter& p : parameters) {
    const at::Tensor& param = p.param;
    if (!param.defined() || !param.requires_grad()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "' does not require grad; nothing to synchronise"));
    }
    if (!seen.insert(param.unsafeGetTensorImpl()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "' is listed twice (a tied weight counts once)"));
    }
    if (param.layout() != c10::kStrided) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "' is sparse; only dense parameters are supported"));
    }
    if (!at::isFloatingType(param.scalar_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", p.name, "' has dtype ", c10::toString(param.scalar_type()),
                       "; only floating-point parameters are supported"));
    }
    KEEL_RETURN_IF_ERROR(base::CheckGroupCarries(
        group, param.device(),
        absl::StrCat("the gradient ", options.collective, " of parameter '", p.name, "'")));
  }
  if (parameters.empty()) {
    return absl::InvalidArgumentError("no parameter that requires grad to synchronise");
  }
  std::unique_ptr<GradBuckets> buckets(
      new GradBuckets(group, std::move(parameters), std::move(launch), options));
  KEEL_RETURN_IF_ERROR(buckets->AssignBuckets(options.bucket_cap_mb, options.portions));
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kInternal, "allocating gradient buckets", [&] {
        for (Bucket& bucket : buckets->buckets_) {
          const at::ScalarType param_dtype = buckets->params_[bucket.params.front()].scalar_type();
          buckets->LayOut(bucket, options.portions, options.main_grad_dtype.value_or(param_dtype));
        }
      }));
  if (group != nullptr) {
    KEEL_RETURN_IF_ERROR(buckets->CheckRanksAgree());
    if (options.init_sync) KEEL_RETURN_IF_ERROR(buckets->BroadcastFromRank0());
  }
  buckets->RegisterHooks();
  return buckets;
}

GradBuckets::GradBuckets(c10d::ProcessGroup* group, std::vector<NamedParameter> parameters,
                         Launch launch, const GradBucketsOptions& options)
    : group_(group),
      parameters_(std::move(parameters)),
      names_(NamesOf(parameters_)),
      params_(TensorsOf(parameters_)),
      launch_(std::move(launch)),
      collective_(options.collective),
      main_grads_(options.main_grad_dtype.has_value()),
      fuse_weight_gradients_(main_grads_ && options.gradient_accumulation_fusion),
      bucket_of_(params_.size()),
      pieces_of_(params_.size()),
      ready_(params_.size(), false),
      accumulated_(params_.size(), false),
      added_(params_.size(), false) {}

GradBuckets::~GradBuckets() {
  for (size_t i = 0; i < hook_handles_.size(); ++i) params_[i].remove_hook(hook_handles_[i]);
  for (size_t i = 0; i < accumulator_hooks_.size(); ++i) {
    accumulators_[i]->del_post_hook(accumulator_hooks_[i]);
  }
}

int64_t GradBuckets::world_size() const { return base::GroupSize(group_); }

at::Tensor GradBuckets::local_gradient_sum() const {
  if (group_ != nullptr) return local_sum_;
  // One rank: the buffers still hold this rank's gradients after Wait.
  at::Tensor sum;
  for (const Bucket& bucket : buckets_) {
    const at::Tensor part = bucket.flat.sum(at::kDouble);
    sum = sum.defined() ? sum + part : part;
  }
  return sum;
}

// As DDP's compute_bucket_assignment_by_size over the reversed parameters: gradients arrive
// roughly in reverse order of registration, so bucket 0 holds the last parameters. Parameters
// of one dtype and device share buckets; each such group starts with a 1 MiB bucket. Cut into
// parts, a shared embedding is alone in its bucket (Megatron's _does_param_require_new_bucket).
absl::Status GradBuckets::AssignBuckets(double bucket_cap_mb, int64_t portions) {
  const auto cap_bytes = static_cast<int64_t>(std::max(1.0, bucket_cap_mb * kBytesPerMb));
  struct Group {
    std::optional<size_t> open_bucket;
    int64_t limit = 0;
  };
  std::map<std::tuple<int, int, int>, Group> groups;  // by (dtype, device type, device index)
  for (size_t i = params_.size(); i-- > 0;) {
    const at::Tensor& param = params_[i];
    auto [it, first] = groups.try_emplace(std::make_tuple(
        static_cast<int>(param.scalar_type()), static_cast<int>(param.device().type()),
        static_cast<int>(param.device().index())));
    Group& group = it->second;
    const bool alone = portions > 1 && parameters_[i].shared_embedding;
    if (alone) group.open_bucket.reset();
    if (!group.open_bucket.has_value()) {
      group.open_bucket = buckets_.size();
      group.limit = first ? std::min(kFirstBucketBytes, cap_bytes) : cap_bytes;
      buckets_.emplace_back();
    }
    const size_t b = *group.open_bucket;
    const int64_t bytes = param.numel() * static_cast<int64_t>(param.element_size());
    bucket_of_[i] = b;
    buckets_[b].params.push_back(i);
    buckets_[b].bytes += bytes;
    total_bytes_ += bytes;
    if (alone || buckets_[b].bytes >= group.limit) group.open_bucket.reset();
  }
  return absl::OkStatus();
}

// Cuts the bucket's M elements into `portions` parts at the row boundaries nearest to
// k * M / portions, then places part k at k * portion_numel (the largest part's size). A
// parameter without elements gets no piece.
void GradBuckets::LayOut(Bucket& bucket, int64_t portions, at::ScalarType dtype) {
  int64_t total = 0;
  for (size_t i : bucket.params) total += params_[i].numel();
  std::vector<int64_t> cuts = {0};
  int64_t start = 0;
  for (size_t i : bucket.params) {
    const int64_t rows = RowCount(params_[i]), width = RowWidth(params_[i]);
    const int64_t end = start + rows * width;
    for (int64_t k = static_cast<int64_t>(cuts.size()); k < portions && k * total / portions <= end;
         ++k) {
      const int64_t row = width == 0 ? 0 : (k * total / portions - start + width / 2) / width;
      cuts.push_back(std::max(cuts.back(), start + std::min(rows, row) * width));
    }
    start = end;
  }
  cuts.push_back(total);
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    bucket.portion_numel = std::max(bucket.portion_numel, cuts[k + 1] - cuts[k]);
  }
  start = 0;
  for (size_t i : bucket.params) {
    const int64_t width = RowWidth(params_[i]);
    const int64_t end = start + params_[i].numel();
    for (int64_t k = 0; k < portions; ++k) {
      const int64_t from = std::max(start, cuts[k]), to = std::min(end, cuts[k + 1]);
      if (from >= to) continue;
      pieces_of_[i].push_back(bucket.pieces.size());
      bucket.pieces.push_back(Piece{i, (from - start) / width, (to - from) / width,
                                    k * bucket.portion_numel + from - cuts[k], k});
    }
    start = end;
  }
  const at::Tensor& first = params_[bucket.params.front()];
  bucket.flat = at::empty({portions * bucket.portion_numel},
                          first.options().dtype(dtype).requires_grad(false));
  bucket.pending = bucket.params.size();
}

// The ranks must agree on the parameters, or the bucket collectives would pair unrelated
// tensors. One all-reduce MAX of (values, -values) yields each value's maximum and minimum.
absl::Status GradBuckets::CheckRanksAgree() {
  std::vector<int64_t> layout;
  int64_t numel = 0;
  for (const at::Tensor& param : params_) {
    layout.push_back(static_cast<int64_t>(param.scalar_type()));
    layout.push_back(param.dim());
    for (int64_t size : param.sizes()) layout.push_back(size);
    numel += param.numel();
  }
  const std::vector<int64_t> local = {static_cast<int64_t>(params_.size()), numel,
                                      Fingerprint(layout)};
  // On the parameters' device: the group may be a device group (NCCL).
  at::Tensor agreement =
      at::tensor({local[0], local[1], local[2], -local[0], -local[1], -local[2]}, at::kLong)
          .to(params_.front().device());
  KEEL_RETURN_IF_ERROR(base::AllReduce(agreement, base::Reduce::kMax, *group_,
                                       "the check that the ranks agree on the parameters"));
  agreement = agreement.cpu();
  const int64_t* data = agreement.data_ptr<int64_t>();
  const std::vector<int64_t> reduced(data, data + 6);
  for (int k = 0; k < 3; ++k) {
    if (reduced[k] != -reduced[k + 3]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ranks' modules differ (parameter count, element count or shapes and dtypes); "
          "rank ",
          group_->getRank(), " has ", local[0], " parameters requiring grad with ", local[1],
          " elements"));
    }
  }
  return absl::OkStatus();
}

absl::Status GradBuckets::BroadcastFromRank0() {
  at::NoGradGuard no_grad;
  c10d::BroadcastOptions from_rank0;
  from_rank0.rootRank = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    KEEL_RETURN_IF_ERROR(base::CallTorch(
        absl::StatusCode::kUnavailable, absl::StrCat("broadcasting parameter bucket ", b), [&] {
          for (const Piece& piece : bucket.pieces) {
            BucketRows(piece).copy_(Rows(params_[piece.param], piece));
          }
          std::vector<at::Tensor> contents = {bucket.flat};
          group_->broadcast(contents, from_rank0)->wait();
          for (const Piece& piece : bucket.pieces) {
            Rows(params_[piece.param], piece).copy_(BucketRows(piece));
          }
        }));
  }
  return absl::OkStatus();
}

at::Tensor& AllocatedGrad(const at::Tensor& param) {
  at::Tensor& grad = param.mutable_grad();
  if (!grad.defined()) grad = at::zeros_like(param);
  return grad;
}

absl::Status BroadcastBuffersFromRank0(torch::nn::Module& module, c10d::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  c10d::BroadcastOptions from_rank0;
  from_rank0.rootRank = 0;
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined() || item.value().layout() != c10::kStrided) continue;
    KEEL_RETURN_IF_ERROR(
        base::CallTorch(absl::StatusCode::kUnavailable,
                        absl::StrCat("broadcasting buffer '", item.key(), "'"), [&] {
                          std::vector<at::Tensor> tensors = {item.value().contiguous()};
                          group.broadcast(tensors, from_rank0)->wait();
                          if (!tensors[0].is_same(item.value())) item.value().copy_(tensors[0]);
                        }));
  }
  return absl::OkStatus();
}

void GradBuckets::RegisterHooks() {
  if (main_grads_) {
    for (size_t i = 0; i < params_.size(); ++i) {
      accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i]));
      auto after = [this, i] { OnAccumulated(i); };
      std::unique_ptr<AfterAccumulation> hook =
          fuse_weight_gradients_
              ? std::make_unique<OfferingMainGrad>(
                    after,
                    [this, i](const at::Tensor& grad_output, const at::Tensor& input) {
                      AddWeightGradient(i, grad_output, input);
                    })
              : std::make_unique<AfterAccumulation>(after);
      accumulator_hooks_.push_back(accumulators_.back()->add_post_hook(std::move(hook)));
    }
    return;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_handles_.push_back(
        params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); }));
  }
}

at::Tensor GradBuckets::Rows(const at::Tensor& tensor, const Piece& piece) {
  return tensor.dim() == 0 ? tensor : tensor.narrow(0, piece.row_begin, piece.rows);
}

at::Tensor GradBuckets::BucketRows(const Piece& piece) {
  return BucketRows(piece, buckets_[bucket_of_[piece.param]].flat);
}

at::Tensor GradBuckets::BucketRows(const Piece& piece, const at::Tensor& flat) {
  const at::Tensor& param = params_[piece.param];
  std::vector<int64_t> shape = param.sizes().vec();
  if (!shape.empty()) shape[0] = piece.rows;
  return flat.narrow(0, piece.offset, piece.rows * RowWidth(param)).view(shape);
}

// Runs inside the autograd engine, before the parameter's AccumulateGrad, with the incoming
// gradient: the bucket receives grad + the gradient accumulated so far. Nothing may throw
// here; errors wait in hook_status_ for Wait().
void GradBuckets::OnGradient(size_t index, const at::Tensor& grad) {
  if (!sync_enabled_.load()) return;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = AddGradientLocked(index, grad);
  if (!status.ok() && hook_status_.ok()) hook_status_ = std::move(status);
}

absl::Status GradBuckets::AddGradientLocked(size_t index, const at::Tensor& grad) {
  if (ready_[index]) return SecondGradientError(index);
  const at::Tensor& accumulated = params_[index].grad();
  absl::Status status;
  if (grad.layout() != c10::kStrided ||
      (accumulated.defined() && accumulated.layout() != c10::kStrided)) {
    status = SparseGradientError(index);
    absl::Status zeroed = ZeroPiecesLocked(index);
    if (!zeroed.ok()) status = std::move(zeroed);
  } else {
    status = ForEachPieceLocked(
        index, absl::StrCat("copying the gradient of '", names_[index], "' into its bucket"),
        [&](const Piece& piece, at::Tensor& rows) {
          if (accumulated.defined()) {
            at::add_out(rows, Rows(accumulated, piece), Rows(grad, piece));
          } else {
            rows.copy_(Rows(grad, piece));
          }
        });
  }
  MarkReadyLocked(index);
  return status;
}

void GradBuckets::OnAccumulated(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = AddMainGradientLocked(index);
  if (!status.ok() && hook_status_.ok()) hook_status_ = std::move(status);
}

// A parameter's gradient of this backward is whatever a layer added (AddWeightGradient) plus
// its .grad, if any.
absl::Status GradBuckets::AddMainGradientLocked(size_t index) {
  at::Tensor& grad = params_[index].mutable_grad();
  const bool added = added_[index];
  added_[index] = false;
  if (!grad.defined() && !added) return absl::OkStatus();
  const bool sync = sync_enabled_.load();
  if (sync && ready_[index]) {
    grad.reset();
    return SecondGradientError(index);
  }
  absl::Status status;
  if (grad.defined() && grad.layout() != c10::kStrided) {
    status = SparseGradientError(index);
  } else if (grad.defined()) {
    status = ForEachPieceLocked(index, MainGradientWrite(index),
                                [&](const Piece& piece, at::Tensor& rows) {
                                  if (accumulated_[index]) {
                                    rows.add_(Rows(grad, piece));
                                  } else {
                                    rows.copy_(Rows(grad, piece));
                                  }
                                });
  }
  accumulated_[index] = true;
  grad.reset();  // as Megatron, the parameter's own gradient is freed once in main_grad
  if (sync) MarkReadyLocked(index);
  return status;
}

// Runs inside a layer's backward, before the parameter's AccumulateGrad. The error of a
// gradient after the parameter's bucket was launched waits for Wait(), the rows untouched.
void GradBuckets::AddWeightGradient(size_t index, const at::Tensor& grad_output,
                                    const at::Tensor& input) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status;
  if (sync_enabled_.load() && ready_[index]) {
    status = SecondGradientError(index);
  } else {
    status = ForEachPieceLocked(
        index, MainGradientWrite(index), [&](const Piece& piece, at::Tensor& rows) {
          parallel::AddProductInto(rows, grad_output.narrow(1, piece.row_begin, piece.rows), input,
                                   /*overwrite=*/!accumulated_[index]);
        });
    accumulated_[index] = true;
    added_[index] = true;
  }
  if (!status.ok() && hook_status_.ok()) hook_status_ = std::move(status);
}

absl::Status GradBuckets::ForEachPieceLocked(
    size_t index, const std::string& what,
    const std::function<void(const Piece&, at::Tensor&)>& write) {
  return base::CallTorch(absl::StatusCode::kInternal, what, [&] {
    const Bucket& bucket = buckets_[bucket_of_[index]];
    for (size_t p : pieces_of_[index]) {
      const Piece& piece = bucket.pieces[p];
      at::Tensor rows = BucketRows(piece);
      write(piece, rows);
    }
  });
}

std::string GradBuckets::MainGradientWrite(size_t index) const {
  return absl::StrCat("adding the gradient of '", names_[index], "' to its main gradient");
}

void GradBuckets::SkipBackward() {
  EnableSync(true);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    absl::Status status = TakeAccumulatedLocked(i);
    if (!status.ok() && hook_status_.ok()) hook_status_ = std::move(status);
    MarkReadyLocked(i);
  }
}

absl::Status GradBuckets::TakeAccumulatedLocked(size_t index) {
  if (main_grads_) return accumulated_[index] ? absl::OkStatus() : ZeroPiecesLocked(index);
  const at::Tensor& accumulated = params_[index].grad();
  if (!accumulated.defined()) return ZeroPiecesLocked(index);
  if (accumulated.layout() != c10::kStrided) {
    absl::Status zeroed = ZeroPiecesLocked(index);
    if (!zeroed.ok()) return zeroed;
    return SparseGradientError(index);
  }
  return ForEachPieceLocked(
      index, absl::StrCat("copying the gradient of '", names_[index], "' into its bucket"),
      [&](const Piece& piece, at::Tensor& rows) { rows.copy_(Rows(accumulated, piece)); });
}

absl::Status GradBuckets::SecondGradientError(size_t index) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "parameter '", names_[index],
      "' received a second gradient before Wait(); call Wait() after each synchronised "
      "backward"));
}

absl::Status GradBuckets::SparseGradientError(size_t index) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "parameter '", names_[index], "' has a sparse gradient; only dense gradients are supported"));
}

absl::Status GradBuckets::ZeroPiecesLocked(size_t index) {
  return ForEachPieceLocked(index, "zeroing a bucket slot",
                            [](const Piece&, at::Tensor& rows) { rows.zero_(); });
}

void GradBuckets::MarkReadyLocked(size_t index) {
  ready_[index] = true;
  ++num_ready_;
  --buckets_[bucket_of_[index]].pending;
  LaunchReadyBucketsLocked();
}

// Collectives pair up by call order, so bucket k is launched only after buckets 0..k-1, on
// every rank, whatever order the gradients arrive in.
void GradBuckets::LaunchReadyBucketsLocked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    absl::Status status =
        base::CallTorch(absl::StatusCode::kUnavailable,
                        absl::StrCat(collective_, " of gradient bucket ", next_bucket_), [&] {
                          if (group_ == nullptr) return;  // one rank: nothing to reduce
                          // This rank's own gradients, before the reduction replaces them.
                          const at::Tensor sum = bucket.flat.sum(at::kDouble);
                          pending_sum_ = pending_sum_.defined() ? pending_sum_ + sum : sum;
                          bucket.work = launch_(next_bucket_, bucket);
                        });
    if (!status.ok() && hook_status_.ok()) hook_status_ = std::move(status);
    ++next_bucket_;
  }
}

absl::Status GradBuckets::Wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (num_ready_ == 0 && !sync_enabled_.load()) {
    return absl::FailedPreconditionError(
        "Wait() called in gradient-accumulation mode with no synchronised backward pending; "
        "call PrepareForFinalBackward() before the last micro-batch's backward");
  }
  absl::Status status = std::move(hook_status_);
  hook_status_ = absl::OkStatus();

  // Parameters that got no gradient contribute zeros, so that every bucket is still reduced
  // and the ranks' collectives stay paired; the error is reported below.
  size_t missing = 0;
  std::string first_missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (missing++ == 0) first_missing = names_[i];
    absl::Status zeroed = ZeroPiecesLocked(i);
    if (!zeroed.ok() && status.ok()) status = std::move(zeroed);
    MarkReadyLocked(i);
  }
  if (missing > 0 && status.ok()) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "parameter '", first_missing, "'",
        missing > 1 ? absl::StrCat(" and ", missing - 1, " other(s)") : std::string(),
        " received no gradient in the synchronised backward; unused parameters are not "
        "supported (set requires_grad(false) on them or run backward before Wait())"));
  }
  // Launching the buckets completed above may have failed too.
  if (!hook_status_.ok() && status.ok()) status = hook_status_;
  hook_status_ = absl::OkStatus();

  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.work) {
      absl::Status waited = base::CallTorch(
          absl::StatusCode::kUnavailable,
          absl::StrCat(collective_, " of gradient bucket ", b, " (", bucket.bytes, " bytes)"),
          [&] { bucket.work->wait(); });
      if (!waited.ok() && status.ok()) status = std::move(waited);
      bucket.work.reset();
    }
    bucket.pending = bucket.params.size();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(accumulated_.begin(), accumulated_.end(), false);
  std::fill(added_.begin(), added_.end(), false);
  num_ready_ = 0;
  next_bucket_ = 0;
  local_sum_ = std::move(pending_sum_);
  pending_sum_ = at::Tensor();
  if (group_ == nullptr) return status;
  return base::AgreeOnFailure(status, *group_, params_.front().device(),
                              absl::StrCat("the gradient ", collective_));
}

}  // namespace keel::gradients::internal
