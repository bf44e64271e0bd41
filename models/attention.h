// Self-attention with grouped-query heads under Hugging Face's Llama names, on tensor-parallel
// layers: q_proj, k_proj and v_proj are column-parallel (each rank holds its query heads and
// the key-value heads they read: tp divides num_key_value_heads), computed as one matrix product
// of their weights stacked (Megatron's linear_qkv), o_proj row-parallel. Each query head i
// reads key-value head i / (heads / kv heads) (HF's repeat_kv), through the fused attention's
// grouped-query mode where it has one (base/attention.h). RoPE rotates queries and keys;
// Qwen3's per-head RMSNorms of queries and keys (q_norm, k_norm) come before it; Qwen2's q/k/v
// have biases; Mistral's window limits how far back a position attends.
//
//   Attention attention(options, tp);
//   at::Tensor y = attention->forward(x, tables, /*packed=*/nullptr);  // x [batch, seq, hidden]
#ifndef KEEL_MODELS_ATTENTION_H_
#define KEEL_MODELS_ATTENTION_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "base/attention.h"
#include "models/rms_norm.h"
#include "models/rotary.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::models {

struct AttentionOptions {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  // Biases on q_proj, k_proj and v_proj (Qwen2). Default: none.
  bool qkv_bias = false;
  // RMSNorms of each query and key head (Qwen3), with this epsilon. Default: none.
  bool qk_norm = false;
  double norm_eps = 1e-6;
  // Each position attends to the `window` positions ending at it (Mistral's sliding_window);
  // 0: all before it.
  int64_t window = 0;
  // The attention of the projected heads keeps only q, k and v for backward, and runs again in
  // it (parallel/recompute.h's kCoreAttn).
  // Default: off.
  bool recompute_core_attn = false;
};

class AttentionImpl : public torch::nn::Module {
 public:
  // Requires: sizes positive; num_kv_heads divides num_heads; tp's size divides num_kv_heads.
  AttentionImpl(const AttentionOptions& options, c10d::ProcessGroup* tp,
                bool sequence_parallel = false);
  // `x` [batch, seq, hidden] whole on every rank (with sequence parallelism this rank's share of
  // the sequence), `tables` the RoPE tables of the whole sequence's positions in x's dtype (of
  // seq positions, or AtPositions'), `packed` the sequences packed into its rows (nullptr: one
  // per row). Returns x's shape, whole (or this rank's share).
  at::Tensor forward(const at::Tensor& x, const RotaryTables& tables,
                     const base::PackedSequences* packed);

 private:
  // [batch, seq, heads x head_dim] -> [batch, heads, seq, head_dim].
  at::Tensor Heads(const at::Tensor& projected, int64_t heads) const;

  AttentionOptions options_;
  int64_t local_heads_, local_kv_heads_;
  parallel::ColumnParallelLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr};
  parallel::RowParallelLinear o_proj_{nullptr};
  RmsNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace keel::models

#endif  // KEEL_MODELS_ATTENTION_H_
