#include "gradients/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/collectives.h"
#include "base/status.h"
#include "gradients/internal/norm_kernels.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::gradients {
namespace {

// Every tensor expression below is the ATen op sequence NeMo runs (same ops, same dtypes,
// same order), so results equal NeMo's bit for bit on the same LibTorch build.

using parallel::Placement;
using GroupKey = std::vector<std::tuple<c10d::ProcessGroup*, Placement>>;

// max if finite and non-zero, else 1: NeMo's scale for the max-scaled p-norm.
at::Tensor SafeScale(const at::Tensor& max) {
  return at::where(at::isfinite(max).logical_and(max.ne(0)), max, at::ones_like(max));
}

// Each non-replicated dimension of a group's layout (after Partial resolution).
std::vector<c10d::ProcessGroup*> ShardedGroups(const GroupKey& key) {
  std::vector<c10d::ProcessGroup*> groups;
  for (const auto& [group, placement] : key) {
    if (placement.kind != Placement::Kind::kReplicate) groups.push_back(group);
  }
  return groups;
}

// max(|g|) in one read pass for float32/float64 (aminmax; NaN propagates, a zero is +0 as
// abs().max() gives it); other dtypes keep NeMo's abs().max().
at::Tensor MaxAbs(const at::Tensor& g) {
  if (g.scalar_type() != at::kFloat && g.scalar_type() != at::kDouble) return g.abs().max();
  auto [min, max] = at::aminmax(g);
  return at::maximum(min.neg(), max).abs();
}

// A float64 buffer of n elements, kept per thread between calls (it grows to the largest
// float32 gradient, 8 bytes per element: less than the op sequence's temporaries for it).
at::Tensor Scratch(int64_t n) {
  thread_local at::Tensor buffer;
  if (!buffer.defined() || buffer.numel() < n) buffer = at::empty({n}, at::kDouble);
  return buffer.narrow(0, 0, n);
}

// NeMo's term g.abs().div(scale).square().sum(float64) (or .pow(p) for p != 2). On the CPU
// ATen's sum widens a float32 input to float64 before it reduces, so for a contiguous float32
// CPU gradient of at least one dimension one pass writes those float64 values into a reused
// buffer and the same reduction runs over them: bit-identical, without the four temporaries.
// A 0-d gradient divided by the 0-d float64 scale is promoted to float64 (two 0-d operands
// promote as tensors of one category), so it keeps ATen's ops.
at::Tensor ScaledPowerSum(const at::Tensor& g, const at::Tensor& scale, double norm_type) {
  if (norm_type == 2.0 && g.scalar_type() == at::kFloat && g.is_cpu() && g.is_contiguous() &&
      g.dim() > 0) {
    at::Tensor squares = Scratch(g.numel()).view(g.sizes());
    // ATen divides by the float64 0-d scale cast to float32 (exact: it is a float32's max).
    internal::ScaledSquares(g, static_cast<float>(scale.item<double>()),
                            squares.data_ptr<double>());
    return squares.sum(at::kDouble);
  }
  const at::Tensor scaled = g.abs().div(scale);
  return (norm_type == 2.0 ? scaled.square() : scaled.pow(norm_type)).sum(at::kDouble);
}

absl::StatusOr<at::Tensor> GroupNorm(const std::vector<at::Tensor>& grads, const GroupKey& key,
                                     double norm_type, const at::Device& device) {
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor local_max = at::zeros({}, f64);
  for (const at::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    local_max = at::maximum(local_max, MaxAbs(g.detach()).to(device, at::kDouble));
  }
  const std::vector<c10d::ProcessGroup*> sharded = ShardedGroups(key);
  for (c10d::ProcessGroup* group : sharded) {
    KEEL_RETURN_IF_ERROR(base::AllReduce(local_max, base::Reduce::kMax, *group, "a gradient norm"));
  }
  if (std::isinf(norm_type)) return local_max;

  const at::Tensor scale = SafeScale(local_max);
  at::Tensor local_val = at::zeros({}, f64);
  for (const at::Tensor& g : grads) {
    if (g.numel() == 0) continue;
    local_val = local_val + ScaledPowerSum(g.detach(), scale, norm_type);
  }
  for (c10d::ProcessGroup* group : sharded) {
    KEEL_RETURN_IF_ERROR(base::AllReduce(local_val, base::Reduce::kSum, *group, "a gradient norm"));
  }
  return local_max * local_val.pow(1.0 / norm_type);
}

// A float32/bfloat16/float16 gradient's 2-norm, accumulated in float (a float16 sum of
// squares overflows): LibTorch's norm kernel, or for a contiguous bfloat16 CPU gradient one
// read pass (LibTorch's would first convert the whole tensor to float).
at::Tensor ReducedPrecisionTwoNorm(const at::Tensor& g) {
  if (g.scalar_type() == at::kFloat) return g.norm();
  if (g.scalar_type() == at::kBFloat16 && g.is_cpu() && g.is_contiguous()) {
    return at::scalar_tensor(std::sqrt(internal::BFloat16SumOfSquares(g)), at::kDouble);
  }
  return at::norm(g, 2, at::kFloat);
}

// The fused 2-norm of an unsharded group: LibTorch's vectorized per-tensor norm kernel (one
// read pass, float accumulation for float32 as torch.nn.utils.clip_grad_norm_), combined in
// float64. float64 gradients take the exact path (their squares can overflow unscaled).
std::optional<at::Tensor> FusedTwoNorm(const std::vector<at::Tensor>& grads,
                                       const at::Device& device) {
  std::vector<at::Tensor> norms;
  for (const at::Tensor& g : grads) {
    if (g.scalar_type() == at::kDouble) return std::nullopt;
    if (g.numel() == 0) continue;
    norms.push_back(ReducedPrecisionTwoNorm(g.detach()).to(device, at::kDouble));
  }
  if (norms.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  return at::stack(norms).norm();
}

at::Tensor CombineNorms(const std::vector<at::Tensor>& norms, double norm_type,
                        const at::Device& device) {
  if (norms.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> converted;
  for (const at::Tensor& n : norms) converted.push_back(n.to(device, at::kDouble));
  const at::Tensor stack = at::stack(converted);
  if (std::isinf(norm_type)) return stack.max();
  const at::Tensor max_norm = stack.abs().max();
  return max_norm * stack.div(SafeScale(max_norm)).pow(norm_type).sum().pow(1.0 / norm_type);
}

// `tensors` split by device and dtype, in order of first appearance (PyTorch's
// _group_tensors_by_device_and_dtype, for one list).
std::vector<std::vector<at::Tensor>> ByDeviceAndDtype(const std::vector<at::Tensor>& tensors) {
  std::vector<std::pair<at::Device, at::ScalarType>> keys;
  std::vector<std::vector<at::Tensor>> batches;
  for (const at::Tensor& t : tensors) {
    const std::pair<at::Device, at::ScalarType> key{t.device(), t.scalar_type()};
    const size_t i = std::find(keys.begin(), keys.end(), key) - keys.begin();
    if (i == keys.size()) {
      keys.push_back(key);
      batches.emplace_back();
    }
    batches[i].push_back(t);
  }
  return batches;
}

// torch.nn.utils.clip_grad_norm_'s per-tensor norms of `grads`: one _foreach_norm per device
// and dtype, each norm moved to `device` (_get_total_norm's list before its stack).
std::vector<at::Tensor> ForeachNorms(const std::vector<at::Tensor>& grads, double p,
                                     const at::Device& device) {
  std::vector<at::Tensor> norms;
  for (const std::vector<at::Tensor>& batch : ByDeviceAndDtype(grads)) {
    for (const at::Tensor& norm : at::_foreach_norm(batch, p)) norms.push_back(norm.to(device));
  }
  return norms;
}

// One sharded layout's gradients under kForeach: its blocks' norm on each rank, exchanged in
// `exchange` (the p-th powers summed, or the maxima taken, over its sharded groups).
struct ShardedGrads {
  std::vector<at::Tensor> grads;
  at::ScalarType exchange = at::kFloat;
};

// _get_total_norm's norm over the unsharded gradients' per-tensor norms and each sharded
// layout's norm.
absl::StatusOr<at::Tensor> ForeachTotal(const std::vector<at::Tensor>& unsharded,
                                        const std::vector<GroupKey>& sharded_keys,
                                        std::map<GroupKey, ShardedGrads>& sharded, double p,
                                        const at::Device& device) {
  std::vector<at::Tensor> norms = ForeachNorms(unsharded, p, device);
  for (const GroupKey& key : sharded_keys) {
    const ShardedGrads& group = sharded[key];
    const at::TensorOptions exchange = at::TensorOptions().dtype(group.exchange).device(device);
    const std::vector<at::Tensor> local = ForeachNorms(group.grads, p, device);
    at::Tensor norm = local.empty() ? at::zeros({}, exchange)
                                    : at::linalg_vector_norm(at::stack(local), p).to(exchange);
    if (!std::isinf(p)) norm = norm.pow(p);
    for (c10d::ProcessGroup* g : ShardedGroups(key)) {
      KEEL_RETURN_IF_ERROR(base::AllReduce(
          norm, std::isinf(p) ? base::Reduce::kMax : base::Reduce::kSum, *g, "a gradient norm"));
    }
    norms.push_back(std::isinf(p) ? norm : norm.pow(1.0 / p));
  }
  if (norms.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  return at::linalg_vector_norm(at::stack(norms), p);
}

// _clip_grads_with_norm_: coef = clamp(max_norm / (total + 1e-6), max=1) in the total's dtype,
// then one _foreach_mul_ per device and dtype.
void ForeachScaleGrads(const std::vector<at::Tensor>& grads, double max_norm,
                       const at::Tensor& total) {
  const at::Tensor coef = (total + 1e-6).reciprocal().mul(max_norm).clamp_max(1.0);
  for (const std::vector<at::Tensor>& batch : ByDeviceAndDtype(grads)) {
    at::_foreach_mul_(batch, coef.to(batch.front().device()));
  }
}

// torch 2.6's clip_grads_with_norm_: coef = clamp(max_norm / (total + 1e-6), max=1), where a
// Python float divided by a tensor is reciprocal() * float. No host synchronization.
void ScaleGrads(const std::vector<at::Tensor>& grads, double max_norm, const at::Tensor& total,
                bool foreach) {
  const at::Tensor coef = (total + 1e-6).reciprocal().mul(max_norm).clamp_max(1.0);
  std::vector<at::Tensor> batched;
  for (const at::Tensor& g : grads) {
    // float32/float64 times the 0-d float64 coefficient computes in the gradient's dtype either
    // way; reduced-precision dtypes keep the per-tensor op NeMo's values come from.
    const bool exact_in_batch = g.scalar_type() == at::kFloat || g.scalar_type() == at::kDouble;
    if (foreach && exact_in_batch && g.device() == coef.device()) {
      batched.push_back(g);
    } else {
      g.mul_(coef.to(g.device()));
    }
  }
  if (!batched.empty()) at::_foreach_mul_(batched, coef);
}

// The p-norm over the pipeline stages of each stage's total (every stage joins, whatever
// its gradients).
absl::StatusOr<at::Tensor> CombineOverStages(at::Tensor total, double p,
                                             c10d::ProcessGroup& pp_group) {
  if (std::isinf(p)) {
    KEEL_RETURN_IF_ERROR(base::AllReduce(total, base::Reduce::kMax, pp_group, "a gradient norm"));
    return total;
  }
  at::Tensor pp_max = total.abs().clone();
  KEEL_RETURN_IF_ERROR(base::AllReduce(pp_max, base::Reduce::kMax, pp_group, "a gradient norm"));
  total = total.div(SafeScale(pp_max)).pow(p);
  KEEL_RETURN_IF_ERROR(base::AllReduce(total, base::Reduce::kSum, pp_group, "a gradient norm"));
  return pp_max * total.pow(1.0 / p);
}

// A parameter and its layout's key before Partial dimensions are resolved.
struct LaidOut {
  at::Tensor param;
  GroupKey key;
};

GroupKey KeyOf(const parallel::TensorLayout& layout) {
  GroupKey key;
  for (const parallel::LayoutDim& dim : layout.dims) key.emplace_back(dim.group, dim.placement);
  return key;
}

at::Device FirstDevice(const std::vector<NamedParameter>& parameters) {
  return parameters.front().param.device();
}

// Gradients summed together over one group, as one flat buffer.
struct PartialBucket {
  c10d::ProcessGroup* group = nullptr;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<at::Tensor> params;
  int64_t bytes = 0;
};

// Buckets stay below this size; a larger gradient has one of its own.
constexpr int64_t kPartialBucketBytes = 32 << 20;

// Sums the bucket's gradients over its group in one all-reduce; a parameter without a gradient
// contributes zeros and receives the sum as its gradient.
absl::Status AllReducePartialBucket(const PartialBucket& bucket) {
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& param : bucket.params) {
    const at::Tensor grad = param.grad();
    flat_parts.push_back(grad.defined() ? grad.reshape({-1})
                                        : at::zeros({param.numel()}, param.options()));
  }
  at::Tensor flat = at::cat(flat_parts);
  KEEL_RETURN_IF_ERROR(
      base::AllReduce(flat, base::Reduce::kSum, *bucket.group, "Partial gradients"));
  int64_t offset = 0;
  for (const at::Tensor& param : bucket.params) {
    const at::Tensor summed = flat.narrow(0, offset, param.numel()).view(param.sizes());
    offset += param.numel();
    at::Tensor grad = param.grad();
    if (grad.defined()) {
      grad.copy_(summed);
    } else {
      at::Tensor owner = param;
      owner.mutable_grad() = summed.clone();
    }
  }
  return absl::OkStatus();
}

// Resolves every Partial dimension into Replicate: round k sums each parameter's k-th Partial
// dimension (so a parameter's dimensions are summed in layout order), bucketed by group, dtype
// and device in parameter order, the same buckets on every rank whatever its gradients.
absl::Status ResolvePartials(std::vector<LaidOut>& laid_out) {
  for (size_t round = 0;; ++round) {
    std::vector<PartialBucket> buckets;
    for (LaidOut& entry : laid_out) {
      size_t seen = 0;
      for (auto& [group, placement] : entry.key) {
        if (placement.kind != Placement::Kind::kPartial || seen++ != round) continue;
        const int64_t bytes = entry.param.numel() * entry.param.element_size();
        auto it = std::find_if(buckets.begin(), buckets.end(), [&](const PartialBucket& b) {
          return b.group == group && b.dtype == entry.param.scalar_type() &&
                 b.device == entry.param.device() && b.bytes + bytes <= kPartialBucketBytes;
        });
        if (it == buckets.end()) {
          it = buckets.insert(
              buckets.end(),
              PartialBucket{group, entry.param.scalar_type(), entry.param.device(), {}, 0});
        }
        it->params.push_back(entry.param);
        it->bytes += bytes;
      }
    }
    if (buckets.empty()) break;
    for (const PartialBucket& bucket : buckets) {
      KEEL_RETURN_IF_ERROR(AllReducePartialBucket(bucket));
    }
  }
  for (LaidOut& entry : laid_out) {
    for (auto& [group, placement] : entry.key) {
      if (placement.kind == Placement::Kind::kPartial) placement = Placement::Replicate();
    }
  }
  return absl::OkStatus();
}

// Whether `name` contains NeMo's TE grouped-experts pattern
// (^|\.)mlp\.experts\.(gate_up_linear|down_linear)\.(weight|bias)\d+, without a regex.
bool IsTeExpertParam(absl::string_view name) {
  static constexpr absl::string_view kExperts = "mlp.experts.";
  for (size_t at = name.find(kExperts); at != absl::string_view::npos;
       at = name.find(kExperts, at + 1)) {
    if (at != 0 && name[at - 1] != '.') continue;
    absl::string_view rest = name.substr(at + kExperts.size());
    if (!absl::ConsumePrefix(&rest, "gate_up_linear.") &&
        !absl::ConsumePrefix(&rest, "down_linear.")) {
      continue;
    }
    if (!absl::ConsumePrefix(&rest, "weight") && !absl::ConsumePrefix(&rest, "bias")) continue;
    if (!rest.empty() && absl::ascii_isdigit(static_cast<unsigned char>(rest[0]))) return true;
  }
  return false;
}

// The total over the pipeline stages, checked as options.error_if_nonfinite says.
absl::StatusOr<at::Tensor> FinishTotal(at::Tensor total, const ClipGradNormOptions& options) {
  const double p = options.norm_type;
  if (options.pp_group != nullptr) {
    KEEL_ASSIGN_OR_RETURN(total, CombineOverStages(total, p, *options.pp_group));
  }
  if (options.error_if_nonfinite && !at::isfinite(total).item<bool>()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "The total norm of order ", p,
        " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable "
        "this error and scale the gradients by the non-finite norm anyway, set "
        "`error_if_nonfinite=False`"));
  }
  return total;
}

// NormAlgorithm::kForeach: the unsharded gradients' norms in parameter order (as PyTorch lists
// them), each sharded layout's norm after them; every gradient scaled, shared ones included.
absl::StatusOr<at::Tensor> ForeachClip(double max_norm,
                                       const std::vector<NamedParameter>& parameters,
                                       const std::vector<LaidOut>& laid_out,
                                       const ClipGradNormOptions& options,
                                       const at::Device& target) {
  std::vector<at::Tensor> unsharded, all;
  std::vector<GroupKey> sharded_keys;
  std::map<GroupKey, ShardedGrads> sharded;
  for (size_t i = 0; i < laid_out.size(); ++i) {
    const LaidOut& entry = laid_out[i];
    const at::Tensor grad = entry.param.grad();
    if (grad.defined()) all.push_back(grad);
    if (parameters[i].shared) continue;
    if (ShardedGroups(entry.key).empty()) {
      if (grad.defined()) unsharded.push_back(grad);
      continue;
    }
    auto [it, inserted] = sharded.try_emplace(entry.key);
    if (inserted) sharded_keys.push_back(entry.key);
    it->second.exchange = at::promoteTypes(it->second.exchange, entry.param.scalar_type());
    if (grad.defined()) it->second.grads.push_back(grad);
  }
  KEEL_ASSIGN_OR_RETURN(at::Tensor total,
                        ForeachTotal(unsharded, sharded_keys, sharded, options.norm_type, target));
  // Stages combine in one dtype whatever theirs (one may hold bfloat16 gradients, one none).
  if (options.pp_group != nullptr &&
      (total.scalar_type() == at::kBFloat16 || total.scalar_type() == at::kHalf)) {
    total = total.to(at::kFloat);
  }
  KEEL_ASSIGN_OR_RETURN(total, FinishTotal(std::move(total), options));
  ForeachScaleGrads(all, max_norm, total);
  return total.to(at::kDouble);
}

}  // namespace

absl::StatusOr<at::Tensor> ClipGradNorm(std::optional<double> max_norm,
                                        const std::vector<NamedParameter>& parameters,
                                        const ClipGradNormOptions& options) {
  const double p = options.norm_type;
  if (!max_norm.has_value()) return at::zeros({}, at::kDouble);
  if (p == 0.0 || std::isnan(p)) {
    return absl::InvalidArgumentError(
        absl::StrCat("norm_type (", p, ") must be non-zero and not NaN"));
  }
  // Layouts come from the parameters, never from which gradients exist, so every rank of a
  // group forms the same groups and runs the same collectives.
  std::vector<LaidOut> laid_out;
  for (const NamedParameter& parameter : parameters) {
    laid_out.push_back({parameter.param, parameter.layout ? KeyOf(*parameter.layout) : GroupKey()});
  }
  KEEL_RETURN_IF_ERROR(ResolvePartials(laid_out));
  const at::Device target = parameters.empty() ? options.device : FirstDevice(parameters);
  const NormAlgorithm algorithm = options.algorithm.value_or(
      target.is_cuda() ? NormAlgorithm::kForeach : NormAlgorithm::kExact);
  if (algorithm == NormAlgorithm::kForeach) {
    return ForeachClip(*max_norm, parameters, laid_out, options, target);
  }

  // Group by the resolved layout, in order of first appearance.
  std::vector<GroupKey> keys;
  std::map<GroupKey, std::vector<at::Tensor>> groups;
  std::vector<at::Tensor> shared;  // clipped, counted on another stage
  for (size_t i = 0; i < laid_out.size(); ++i) {
    const LaidOut& entry = laid_out[i];
    if (parameters[i].shared) {
      if (at::Tensor grad = entry.param.grad(); grad.defined()) shared.push_back(grad);
      continue;
    }
    auto [it, inserted] = groups.try_emplace(entry.key);
    if (inserted) keys.push_back(entry.key);
    if (at::Tensor grad = entry.param.grad(); grad.defined()) it->second.push_back(grad);
  }

  std::vector<at::Tensor> norms;
  for (const GroupKey& key : keys) {
    const std::vector<at::Tensor>& grads = groups[key];
    const bool sharded = !ShardedGroups(key).empty();
    // A local group without gradients adds nothing (NeMo never sees it); a sharded one still
    // joins its collectives, contributing zeros.
    if (grads.empty() && !sharded) continue;
    if (algorithm == NormAlgorithm::kFused && p == 2.0 && !sharded) {
      if (std::optional<at::Tensor> norm = FusedTwoNorm(grads, target)) {
        norms.push_back(*norm);
        continue;
      }
    }
    KEEL_ASSIGN_OR_RETURN(at::Tensor norm, GroupNorm(grads, key, p, target));
    norms.push_back(norm);
  }
  at::Tensor total = CombineNorms(norms, p, target);
  KEEL_ASSIGN_OR_RETURN(total, FinishTotal(std::move(total), options));
  for (const GroupKey& key : keys) ScaleGrads(groups[key], *max_norm, total, options.foreach);
  ScaleGrads(shared, *max_norm, total, options.foreach);
  return total;
}

absl::StatusOr<at::Tensor> ScaleGradsAndClipGradNorm(std::optional<double> max_norm,
                                                     const std::vector<NamedParameter>& parameters,
                                                     const GradScalingOptions& scaling,
                                                     const ClipGradNormOptions& options) {
  if (scaling.expert_tp_replication_factor < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert_tp_replication_factor (", scaling.expert_tp_replication_factor, ") must be >= 1"));
  }
  for (const auto& [name, value] : {std::pair{"num_label_tokens", scaling.num_label_tokens},
                                    {"dp_group_size", scaling.dp_group_size},
                                    {"ep_shard_size", scaling.ep_shard_size}}) {
    if (value.has_value() && *value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, " (", *value, ") must be >= 0"));
    }
  }
  // NeMo would divide the expert gradients by 0 / ep_shard_size = 0: infinite gradients.
  if (scaling.ep_shard_size.value_or(0) > 0 && scaling.dp_group_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dp_group_size (0) must be > 0 for expert scaling (ep_shard_size ",
                     *scaling.ep_shard_size, "): expert gradients would be divided by 0"));
  }
  std::optional<double> pp_divisor;
  if (scaling.pp_enabled && scaling.num_label_tokens.has_value() &&
      scaling.dp_group_size.has_value() && *scaling.dp_group_size != 0) {
    const double candidate = static_cast<double>(*scaling.num_label_tokens) /
                             static_cast<double>(*scaling.dp_group_size);
    if (candidate != 0) pp_divisor = candidate;
  }
  std::optional<double> ep_ratio;
  if (scaling.ep_shard_size.has_value() && scaling.dp_group_size.has_value() &&
      *scaling.ep_shard_size > 0) {
    ep_ratio =
        static_cast<double>(*scaling.dp_group_size) / static_cast<double>(*scaling.ep_shard_size);
    *ep_ratio *= static_cast<double>(scaling.expert_tp_replication_factor);
  }
  if (pp_divisor.has_value() || ep_ratio.has_value()) {
    for (const NamedParameter& parameter : parameters) {
      at::Tensor grad = parameter.param.grad();
      if (!grad.defined()) continue;
      if (pp_divisor.has_value()) grad.div_(*pp_divisor);
      if (!ep_ratio.has_value()) continue;
      if (IsTeExpertParam(parameter.name) || HasLayoutDim(parameter, scaling.ep_axis_name)) {
        grad.div_(*ep_ratio);
      }
    }
  }
  return ClipGradNorm(max_norm, parameters, options);
}

}  // namespace keel::gradients
