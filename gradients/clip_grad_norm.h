// Sharding-aware gradient-norm clipping and PP/EP gradient scaling, value for value with NeMo
// AutoModel's clip_grad_norm, _clip_grad_norm_impl and scale_grads_and_clip_grad_norm
// (nemo_automodel/components/training/utils.py), for gradients laid out over the device mesh
// (each parameter's parallel::TensorLayout).
//
//   std::vector<NamedParameter> params = TrainableParameters({&model});
//   keel::gradients::ClipGradNormOptions options;
//   options.pp_group = pp_group;  // or nullptr
//   KEEL_ASSIGN_OR_RETURN(torch::Tensor norm, ClipGradNorm(1.0, params, options, spec));
#ifndef KEEL_GRADIENTS_CLIP_GRAD_NORM_H_
#define KEEL_GRADIENTS_CLIP_GRAD_NORM_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "gradients/parameters.h"
#include "torch/nn/module.h"

namespace keel::gradients {

// How the norm is computed.
enum class NormAlgorithm {
  // NeMo's: per layout, the max of |g| and the sum of (|g| / max)^p accumulated in float64,
  // bit-identical to NeMo on the same LibTorch build.
  kExact,
  // For the 2-norm of unsharded float32/bfloat16/float16 gradients, one read pass per tensor
  // accumulating in float (LibTorch's norm kernel for float32; Keel's for contiguous bfloat16
  // on the CPU), combined in float64: NeMo's norm up to rounding, not bit for bit. Other norms,
  // dtypes and layouts take the exact path.
  kFused,
  // torch.nn.utils.clip_grad_norm_'s (foreach): per device and dtype one multi-tensor norm
  // kernel (_foreach_norm), the norm of those norms in the gradients' dtype, the coefficient
  // clamp(max_norm / (norm + 1e-6), max=1) in that dtype, one multi-tensor multiply. Bit for bit
  // with PyTorch's function on the same device for gradients of one device and dtype. A layout
  // with sharded dimensions contributes its blocks' norm, whose p-th power is summed over
  // their groups in float32 (float64 for float64 parameters).
  kForeach,
};

// _clip_grad_norm_impl's options.
struct ClipGradNormOptions {
  // p of the p-norm; infinity for the max norm. Must be non-zero. Default: 2.
  double norm_type = 2.0;
  // Pipeline stages whose norms combine into the total; nullptr for none. Default: nullptr.
  c10d::ProcessGroup* pp_group = nullptr;
  // Where the norm is computed when `parameters` is empty (a pipeline stage without
  // parameters still exchanges its zero over pp_group, which may be a device group); otherwise
  // it lives on the first parameter's device. Default: CPU.
  at::Device device = at::kCPU;
  // Scale the gradients with one multi-tensor kernel where it gives the same values. Default: true.
  bool foreach = true;
  // A non-finite total norm is an error instead of being applied. Default: false.
  bool error_if_nonfinite = false;
  // The norm's computation; nullopt: kForeach when the first parameter (else `device`) is a
  // CUDA device, where it runs a few kernels and never waits for the host, kExact elsewhere.
  // Default: nullopt.
  std::optional<NormAlgorithm> algorithm;
};

// NeMo's clip_grad_norm: clips the gradients of `parameters` by their total p-norm.
// - Computed: the p-norm of every gradient together, each element counted once however
//   its layout lays it out, as options.algorithm says: by default NeMo's max-scaled sums in
//   float64 (bit-identical to NeMo) on the CPU, torch.nn.utils.clip_grad_norm_'s multi-tensor
//   kernels (bit-identical to PyTorch) on GPUs. A gradient that does not exist counts as
//   zeros (on every rank the norm is the one with missing gradients taken as zeros), and the
//   collectives depend only on the parameters and their layouts, never on which gradients
//   exist, so a rank whose expert received no tokens runs the same ones as its peers.
//   A `shared` parameter (a pipeline stage's copy of another stage's) is scaled, not counted.
//   For contiguous float32 CPU gradients and p = 2 the exact path writes each element's
//   float64 term into a buffer kept per calling thread, as large as the largest such gradient
//   (8 bytes per element), and reduces it with ATen's own sum, so it allocates nothing per call.
// - Reduced: Partial gradients are first summed in place over their group, in buckets of up to
//   32 MiB (one all-reduce each); a Partial parameter without a gradient receives the sum as
//   its gradient. Each layout's max and sum are reduced (MAX, SUM) over the groups of its
//   sharded dimensions, then over pp_group.
// - Applied: every gradient is multiplied in place by min(1, max_norm / (norm + 1e-6)); a
//   non-finite norm makes NaN gradients, as PyTorch does.
// - max_norm = nullopt: nothing is computed, reduced or clipped, and the result is 0.
// Returns the norm as a 0-d float64 tensor on the gradients' device (no host sync); with
// kForeach, the gradients' dtype's norm converted.
// Collective: over every group of the parameters' layouts, and options.pp_group.
// Errors: kInvalidArgument for norm_type 0 or NaN; kFailedPrecondition for a non-finite norm with
// error_if_nonfinite (PyTorch's message); kUnavailable when a collective fails.
// Requires: every rank of each group calls it with the same groups, layouts and options.
[[nodiscard]] absl::StatusOr<at::Tensor> ClipGradNorm(std::optional<double> max_norm,
                                                      const std::vector<NamedParameter>& parameters,
                                                      const ClipGradNormOptions& options = {});

// scale_grads_and_clip_grad_norm's scaling inputs (its device meshes become group sizes and
// the parameters' layouts).
struct GradScalingOptions {
  // PP scaling applies only when enabled and both counts are given. Default: false.
  bool pp_enabled = false;
  // Label tokens in the global batch, for PP scaling. Default: nullopt.
  std::optional<int64_t> num_label_tokens;
  // Data-parallel group size, for PP and EP scaling. Default: nullopt.
  std::optional<int64_t> dp_group_size;
  // Size of the MoE mesh's "ep_shard" dimension (1 if it has none); nullopt: no MoE mesh,
  // no EP scaling. Default: nullopt.
  std::optional<int64_t> ep_shard_size;
  // Identical TP token replicas gathered inside EP; an integer >= 1. Default: 1.
  int64_t expert_tp_replication_factor = 1;
  // Expert parameters are those whose layout has a dimension of this name, or whose name
  // matches NeMo's TE grouped-experts pattern. Default: "" (names only).
  std::string ep_axis_name;
};

// Divides every gradient by num_label_tokens / dp_group_size (PP), and expert gradients by
// (dp_group_size / ep_shard_size) * expert_tp_replication_factor (EP), in one pass over the
// parameters, then clips as ClipGradNorm. Collective: as ClipGradNorm.
// Errors: kInvalidArgument for expert_tp_replication_factor < 1, a negative count or size, or
// dp_group_size 0 with an ep_shard_size (NeMo would divide by 0); ClipGradNorm's errors.
[[nodiscard]] absl::StatusOr<at::Tensor> ScaleGradsAndClipGradNorm(
    std::optional<double> max_norm, const std::vector<NamedParameter>& parameters,
    const GradScalingOptions& scaling, const ClipGradNormOptions& options = {});

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_CLIP_GRAD_NORM_H_
