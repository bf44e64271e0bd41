#include "models/rms_norm.h"

#include <optional>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/mappings.h"

namespace keel::models {

RmsNormImpl::RmsNormImpl(int64_t size, double eps, c10d::ProcessGroup* partial_over)
    : eps_(eps),
      partial_over_(base::GroupSize(partial_over) > 1 ? partial_over : nullptr),
      weight_(register_parameter("weight", parallel::NewParameter({size}, 1.0))) {}

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  // LibTorch's RMSNorm without a weight is x / sqrt(mean(x^2) + eps) in float32, cast back to
  // x's dtype: on a GPU (LibTorch 2.9 and later) its fused kernel, one forward and one backward,
  // keeping x and a float32 reciprocal a row; elsewhere HF's operations themselves, the same
  // bits. The weight multiplies after the cast, as HF's does, so bf16 rounds where it rounds in
  // transformers. x enters through its alias, one gradient edge, so that x's gradient sums two
  // terms, this norm's and the residual's, the same in either order: recomputing the norm
  // (parallel/recompute.h) changes no bit.
  const at::Tensor normed = at::rms_norm(x.alias(), {x.size(-1)}, /*weight=*/std::nullopt, eps_);
  const at::Tensor weight = partial_over_ == nullptr
                                ? weight_
                                : parallel::CopyToTensorParallelRegion(weight_, partial_over_);
  return weight * normed;
}

}  // namespace keel::models
