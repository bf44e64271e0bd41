// The explicit form of causal attention, for tests and benchmarks only: the reference that
// base::CausalAttention's fused kernels are checked and timed against.
#ifndef KEEL_BASE_ATTENTION_REFERENCE_H_
#define KEEL_BASE_ATTENTION_REFERENCE_H_

#include "ATen/core/Tensor.h"

namespace keel::base {

// softmax(q k^T / sqrt(head_dim)) v through [batch, heads, seq, seq] scores, a -inf mask above
// the diagonal and a softmax.
at::Tensor CausalAttentionExplicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace keel::base

#endif  // KEEL_BASE_ATTENTION_REFERENCE_H_
