// Causal self-attention through LibTorch's fused kernels: at::scaled_dot_product_attention,
// which picks flash or cuDNN kernels for bf16/fp16 on GPUs, the memory-efficient kernel for
// fp32, the CPU's flash kernel, and never holds the [batch, heads, seq, seq] scores. Packed
// rows of several sequences attend block-diagonally: within each sequence only.
//
//   at::Tensor out = keel::base::CausalAttention(q, k, v);  // [batch, heads, seq, head_dim]
//   const PackedSequences packed = PackRows({{5, 3}, {8}}, /*seq=*/8);
//   out = keel::base::PackedCausalAttention(q, k, v, packed.To(q.device()), /*window=*/0);
#ifndef KEEL_BASE_ATTENTION_H_
#define KEEL_BASE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "c10/core/Device.h"

namespace keel::base {

// Causal self-attention of q [batch, heads, seq, head_dim] and k, v [batch, kv_heads, seq,
// head_dim]: softmax(q k^T / sqrt(head_dim)) v, each position attending to itself and the
// positions before it; [batch, heads, seq, head_dim]. Grouped-query attention where kv_heads
// divides heads: query heads g·j to g·j + g - 1 attend with key-value head j (g = heads /
// kv_heads), in the fused kernel's grouped mode where it has one (flash and cuDNN on GPUs, the
// CPU's flash kernel), else through k and v repeated to the query heads.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Causal attention within a sliding window (Mistral's): position i attends to positions j with
// i - window < j <= i, through the window's boolean mask; q, k, v as CausalAttention's.
// CausalAttention when window >= seq. Requires: window > 0.
at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window);

// The sequences packed into the rows of a [batch, seq] batch (Megatron-Core's PackedSeqParams
// in its THD layout, with the position ids beside): each row holds whole sequences end to end,
// and the rest of a row, if any, is one more sequence of padding.
struct PackedSequences {
  // int32 [sequences + 1]: where each sequence starts in the batch flattened to batch x seq
  // tokens, then batch x seq (Megatron's cu_seqlens); no sequence crosses a row.
  at::Tensor cu_seqlens;
  // The longest sequence's length.
  int64_t max_seqlen = 0;
  // int64 [batch, seq]: each token's position in its sequence; 0 for the padding.
  at::Tensor position_ids;

  bool defined() const { return cu_seqlens.defined(); }
  PackedSequences To(const c10::Device& device) const;
};

// `lengths.size()` rows of `seq` tokens, row r holding sequences of lengths[r] one after
// another (empty ones skipped), on the CPU. Requires: each row's lengths sum to at most seq.
PackedSequences PackRows(const std::vector<std::vector<int64_t>>& lengths, int64_t seq);

// Causal attention within each sequence of `packed` (block-diagonal: never across two), within
// a sliding window as SlidingWindowAttention's when window > 0 (0: none), over q, k, v as
// CausalAttention's; [batch, heads, seq, head_dim]. On a GPU in bf16 or fp16 (head_dim a
// multiple of 8 up to 256): ATen's variable-length flash attention over cu_seqlens, which takes
// grouped key-value heads as they are; elsewhere CausalAttention (or SlidingWindowAttention) of
// each sequence in turn, reading cu_seqlens on the host. Requires: `packed` of q's [batch, seq],
// on q's device; window >= 0.
at::Tensor PackedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const PackedSequences& packed, int64_t window);

}  // namespace keel::base

#endif  // KEEL_BASE_ATTENTION_H_
