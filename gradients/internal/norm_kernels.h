// One-pass CPU kernels behind ClipGradNorm, where ATen's op sequence would make a temporary
// per op: NeMo's scaled squares (exact path) and a bfloat16 sum of squares (fused path).
#ifndef KEEL_GRADIENTS_INTERNAL_NORM_KERNELS_H_
#define KEEL_GRADIENTS_INTERNAL_NORM_KERNELS_H_

#include "ATen/core/Tensor.h"

namespace keel::gradients::internal {

// Writes float64((|g[i]| / scale)^2) into out[0, g.numel()), the quotient and the square
// rounded to float32 as ATen's abs, div (by a float64 0-d tensor, cast to float32 first) and
// square round them, so the values equal g.abs().div(scale).square().to(float64) bit for bit.
// Requires: g float32 of one or more dimensions (a 0-d one divides in float64), contiguous, on
// the CPU; `out` holds g.numel() doubles.
void ScaledSquares(const at::Tensor& g, float scale, double* out);

// The sum of g[i]^2, each square and each block of 8192 elements accumulated in float32
// (never in bfloat16), the blocks summed in float64 in index order: the same value whatever
// the thread count. Requires: g bfloat16, contiguous, on the CPU.
double BFloat16SumOfSquares(const at::Tensor& g);

}  // namespace keel::gradients::internal

#endif  // KEEL_GRADIENTS_INTERNAL_NORM_KERNELS_H_
