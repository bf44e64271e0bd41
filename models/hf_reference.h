// Hugging Face's Llama blocks written out op by op, for tests and benchmarks only: the reference
// that models::RmsNorm, models::ApplyRotary and models::SwiGlu are checked and timed against.
#ifndef KEEL_MODELS_HF_REFERENCE_H_
#define KEEL_MODELS_HF_REFERENCE_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "c10/core/ScalarType.h"

namespace keel::models {

// LlamaRMSNorm.forward: weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype).
at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// LlamaRotaryEmbedding's cos and sin for positions 0..seq-1 at inv_freq: of cat(freqs, freqs)
// in float32, then cast to dtype.
struct HfRotaryTables {
  at::Tensor cos, sin;
};
HfRotaryTables HfRotary(const at::Tensor& inv_freq, int64_t seq, at::ScalarType dtype);

// apply_rotary_pos_emb for one of q, k: x * cos + rotate_half(x) * sin, rotate_half(x) =
// cat(-x2, x1) over x's last dimension.
at::Tensor HfApplyRotary(const at::Tensor& x, const HfRotaryTables& tables);

// LlamaMLP's activation: act_fn(gate_proj(x)) * up_proj(x), act_fn SiLU, given the two products.
at::Tensor HfSwiGlu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace keel::models

#endif  // KEEL_MODELS_HF_REFERENCE_H_
