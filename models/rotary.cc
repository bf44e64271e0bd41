#include "models/rotary.h"

#include <cmath>

#include "ATen/ATen.h"

namespace keel::models {

// Each step is the operation HF's Python performs, in its order, so that the float32 roundings
// are the same: Python's `s / t` is t.reciprocal() * s, `s - t` rsub, `s ** t` pow(s, t).
at::Tensor InverseFrequencies(int64_t head_dim, const RopeOptions& options) {
  const at::Tensor exponents =
      at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(options.theta, exponents).reciprocal() * 1.0;
  if (options.scaling_factor == 0.0) return inv_freq;
  const double factor = options.scaling_factor;
  const double low = options.low_freq_factor, high = options.high_freq_factor;
  const double old_context = static_cast<double>(options.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen.gt(low_freq_wavelen), inv_freq / factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
  const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / factor + smooth * scaled;
  const at::Tensor medium = wavelen.lt(high_freq_wavelen)
                                .logical_not()
                                .logical_and(wavelen.gt(low_freq_wavelen).logical_not());
  return at::where(medium, smoothed, scaled);
}

RotaryTables MakeRotaryTables(const at::Tensor& inv_freq, int64_t seq,
                              const at::TensorOptions& options) {
  const at::Tensor positions = at::arange(seq, at::kLong).to(at::kFloat);
  const at::Tensor freqs = positions.unsqueeze(-1) * inv_freq;
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  const at::Tensor sin = angles.sin();  // HF's bits: the sines of cat(freqs, freqs)
  const int64_t half = inv_freq.size(0);
  const at::Tensor signed_sin =
      at::cat({sin.narrow(-1, 0, half).neg(), sin.narrow(-1, half, half)}, -1);
  return {angles.cos().to(options), signed_sin.to(options)};
}

RotaryTables AtPositions(const RotaryTables& tables, const at::Tensor& positions) {
  auto rows = [&](const at::Tensor& table) {
    return table.index_select(0, positions.reshape(-1))
        .view({positions.size(0), 1, positions.size(1), table.size(1)});
  };
  return {rows(tables.cos), rows(tables.signed_sin)};
}

at::Tensor ApplyRotary(const at::Tensor& x, const RotaryTables& tables) {
  // [x1, x2] -> [x2, x1]: a flip of the halves keeps x's strides (q and k arrive transposed),
  // and its gradient is the same flip.
  const at::Tensor swapped = x.unflatten(-1, {2, x.size(-1) / 2}).flip(-2).flatten(-2);
  return x * tables.cos + swapped * tables.signed_sin;
}

}  // namespace keel::models
