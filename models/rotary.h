// Rotary position embeddings (RoPE) as Hugging Face's Llama applies them: the head dimensions
// rotate in pairs (i, i + head_dim / 2) ("rotate_half"), by angles position x inv_freq[i] with
// inv_freq[i] = 1 / theta^(2i / head_dim), computed in float32 with HF's operations so the
// tables are its bits, and optionally rescaled as Llama 3.1 does (rope_type "llama3").
//
//   RotaryTables tables = MakeRotaryTables(InverseFrequencies(64, rope), seq, x.options());
//   q = ApplyRotary(q, tables);  // q [batch, heads, seq, head_dim]
#ifndef KEEL_MODELS_ROTARY_H_
#define KEEL_MODELS_ROTARY_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "c10/core/TensorOptions.h"

namespace keel::models {

struct RopeOptions {
  // The base of the wavelengths (HF's rope_theta, Megatron's rotary_base). Default: 10000.
  double theta = 10000.0;
  // Llama 3.1's rescaling (HF's rope_scaling / rope_parameters of rope_type "llama3"); factor 0
  // for none. Wavelengths longer than original_max_position_embeddings / low_freq_factor are
  // divided by factor, those shorter than ... / high_freq_factor kept, the band between
  // blended.
  double scaling_factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq [head_dim / 2] float32 on the CPU. Requires: head_dim even and positive, theta > 0;
// with scaling, factor > 0 and high_freq_factor > low_freq_factor.
at::Tensor InverseFrequencies(int64_t head_dim, const RopeOptions& options);

// cos and sin of each position's angles, [seq, head_dim] (each angle twice, as HF's
// cat(freqs, freqs)), computed in float32 and cast to `options`' dtype on its device. The sines
// of the first half are negated: rotate_half's sign, folded into the table (x·(-s) is (-x)·s in
// every floating-point format), so that rotating takes one flip of x's halves.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor signed_sin;
};
RotaryTables MakeRotaryTables(const at::Tensor& inv_freq, int64_t seq,
                              const at::TensorOptions& options);

// The rows of `tables` at `positions` ([batch, seq] int64: packed sequences, each from 0):
// cos and sin [batch, 1, seq, head_dim], for x [batch, heads, seq, head_dim]. Requires:
// positions within the tables.
RotaryTables AtPositions(const RotaryTables& tables, const at::Tensor& positions);

// x * cos + rotate_half(x) * sin over x [batch, heads, seq, head_dim]: HF's bits, forward and
// backward, in four kernels each way (a flip of x's halves, two products, a sum) where HF's
// negation, concatenation of strided halves and their sliced gradients take about twice that.
at::Tensor ApplyRotary(const at::Tensor& x, const RotaryTables& tables);

}  // namespace keel::models

#endif  // KEEL_MODELS_ROTARY_H_
