// Causal self-attention through LibTorch's fused kernels: at::scaled_dot_product_attention,
// which picks flash or cuDNN kernels for bf16/fp16 on GPUs, the memory-efficient kernel for
// fp32, the CPU's flash kernel, and never holds the [batch, heads, seq, seq] scores.
//
//   at::Tensor out = keel::base::CausalAttention(q, k, v);  // [batch, heads, seq, head_dim]
#ifndef KEEL_BASE_ATTENTION_H_
#define KEEL_BASE_ATTENTION_H_

#include <cstdint>

#include "ATen/core/Tensor.h"

namespace keel::base {

// Causal self-attention of q, k, v [batch, heads, seq, head_dim]: softmax(q k^T / sqrt(head_dim))
// v, each position attending to itself and the positions before it; [batch, heads, seq,
// head_dim].
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Causal attention within a sliding window (Mistral's): position i attends to positions j with
// i - window < j <= i, through the window's boolean mask. CausalAttention when window >= seq.
// Requires: window > 0.
at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window);

}  // namespace keel::base

#endif  // KEEL_BASE_ATTENTION_H_
