#include "models/attention.h"

#include <vector>

#include "ATen/ATen.h"
#include "base/attention.h"
#include "base/collectives.h"
#include "parallel/recompute.h"

namespace keel::models {

AttentionImpl::AttentionImpl(const AttentionOptions& options, c10d::ProcessGroup* tp,
                             bool sequence_parallel)
    : options_(options),
      local_heads_(options.num_heads / base::GroupSize(tp)),
      local_kv_heads_(options.num_kv_heads / base::GroupSize(tp)) {
  const int64_t h = options.hidden_size, d = options.head_dim;
  const auto column = [&](int64_t heads) {
    return parallel::ColumnParallelLinear(h, heads * d, tp, options.qkv_bias,
                                          /*gather_output=*/false, sequence_parallel);
  };
  q_proj_ = register_module("q_proj", column(options.num_heads));
  k_proj_ = register_module("k_proj", column(options.num_kv_heads));
  v_proj_ = register_module("v_proj", column(options.num_kv_heads));
  o_proj_ = register_module(
      "o_proj", parallel::RowParallelLinear(options.num_heads * d, h, tp, /*bias=*/false,
                                            /*input_is_parallel=*/true, sequence_parallel));
  if (options.qk_norm) {
    q_norm_ = register_module("q_norm", RmsNorm(d, options.norm_eps, tp));
    k_norm_ = register_module("k_norm", RmsNorm(d, options.norm_eps, tp));
  }
}

at::Tensor AttentionImpl::Heads(const at::Tensor& projected, int64_t heads) const {
  return projected.view({projected.size(0), projected.size(1), heads, options_.head_dim});
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const RotaryTables& tables,
                                  const base::PackedSequences* packed) {
  // q, k and v from one product (and under sequence parallelism one gather of x).
  const std::vector<at::Tensor> qkv = parallel::ColumnParallelLinearImpl::ForwardStacked(
      x, {q_proj_.get(), k_proj_.get(), v_proj_.get()});
  at::Tensor q = Heads(qkv[0], local_heads_);
  at::Tensor k = Heads(qkv[1], local_kv_heads_);
  if (options_.qk_norm) {
    q = q_norm_->forward(q);
    k = k_norm_->forward(k);
  }
  q = ApplyRotary(q.transpose(1, 2), tables);
  k = ApplyRotary(k.transpose(1, 2), tables);
  // v of its own, unless the q/k norms keep the stacked product for backward anyway: as a view,
  // v would keep all of it (q and k as projected) alive while the attention keeps v.
  const at::Tensor v =
      Heads(options_.qk_norm ? qkv[2] : qkv[2].contiguous(), local_kv_heads_).transpose(1, 2);
  const int64_t window = options_.window;
  // k and v keep their key-value heads: the attention groups the query heads over them.
  const at::Tensor attended = parallel::RecomputeIf(
      options_.recompute_core_attn,
      [window, packed](const std::vector<at::Tensor>& qkv) {
        const at::Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];
        return packed != nullptr ? base::PackedCausalAttention(q, k, v, *packed, window)
               : window > 0      ? base::SlidingWindowAttention(q, k, v, window)
                                 : base::CausalAttention(q, k, v);
      },
      {q, k, v}, {});
  // [batch, heads, seq, head_dim] -> [batch, seq, heads x head_dim], the whole sequence.
  return o_proj_->forward(attended.transpose(1, 2).flatten(2));
}

}  // namespace keel::models
