#include "models/rms_norm.h"

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
  // One gradient edge into x (float32 x's alias: to() would be x itself, read twice below), so
  // that x's gradient sums two terms, this norm's and the residual's, the same in either order:
  // recomputing the norm (parallel/recompute.h) changes no bit.
  const at::Tensor wide = x.to(at::kFloat).alias();
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  const at::Tensor weight = partial_over_ == nullptr
                                ? weight_
                                : parallel::CopyToTensorParallelRegion(weight_, partial_over_);
  return weight * normed.to(x.scalar_type());
}

}  // namespace keel::models
