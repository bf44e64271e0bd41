#include "base/attention.h"

#include "ATen/ATen.h"

namespace keel::base {

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
}

at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window) {
  const int64_t seq = q.size(-2);
  if (window >= seq) return CausalAttention(q, k, v);
  const at::Tensor positions = at::arange(seq, q.options().dtype(at::kLong));
  const at::Tensor behind = positions.unsqueeze(1) - positions.unsqueeze(0);  // i - j
  return at::scaled_dot_product_attention(q, k, v, behind.ge(0).logical_and(behind.lt(window)));
}

}  // namespace keel::base
