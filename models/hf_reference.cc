#include "models/hf_reference.h"

#include "ATen/ATen.h"

namespace keel::models {

at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor wide = x.to(at::kFloat);
  const at::Tensor variance = wide.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (wide * at::rsqrt(variance + eps)).to(x.scalar_type());
}

HfRotaryTables HfRotary(const at::Tensor& inv_freq, int64_t seq, at::ScalarType dtype) {
  const at::Tensor freqs = at::arange(seq, at::kLong).to(at::kFloat).unsqueeze(-1) * inv_freq;
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

at::Tensor HfApplyRotary(const at::Tensor& x, const HfRotaryTables& tables) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos.to(x.device()) + rotated * tables.sin.to(x.device());
}

at::Tensor HfSwiGlu(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

}  // namespace keel::models
