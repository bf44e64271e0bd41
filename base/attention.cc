#include "base/attention.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "ATen/ATen.h"
#include "ATen/SDPBackend.h"
#include "c10/util/Exception.h"

namespace keel::base {
namespace {

// at::scaled_dot_product_attention without dropout, k and v of q's heads or of fewer: in
// grouped-query mode where LibTorch's fused kernel for these inputs takes it (flash and cuDNN on
// GPUs, the CPU's flash kernel); repeated to q's heads where grouping would fall back to the
// math kernel (GPUs' memory-efficient kernel, which float32 and masks take there).
at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& mask, bool is_causal) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  TORCH_CHECK(v.size(1) == kv_heads && kv_heads > 0 && heads % kv_heads == 0,
              "attention: the key and value heads (", kv_heads, ", ", v.size(1),
              ") must be equal and divide the query heads (", heads, ")");
  const bool grouped = kv_heads != heads;
  if (grouped && at::_fused_sdp_choice(q, k, v, mask, /*dropout_p=*/0.0, is_causal,
                                       /*scale=*/std::nullopt, /*enable_gqa=*/true) ==
                     static_cast<int64_t>(at::SDPBackend::math)) {
    return at::scaled_dot_product_attention(q, k.repeat_interleave(heads / kv_heads, 1),
                                            v.repeat_interleave(heads / kv_heads, 1), mask,
                                            /*dropout_p=*/0.0, is_causal);
  }
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, is_causal,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/grouped);
}

}  // namespace

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return Attend(q, k, v, /*mask=*/std::nullopt, /*is_causal=*/true);
}

at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window) {
  const int64_t seq = q.size(-2);
  if (window >= seq) return CausalAttention(q, k, v);
  const at::Tensor positions = at::arange(seq, q.options().dtype(at::kLong));
  const at::Tensor behind = positions.unsqueeze(1) - positions.unsqueeze(0);  // i - j
  return Attend(q, k, v, behind.ge(0).logical_and(behind.lt(window)), /*is_causal=*/false);
}

PackedSequences PackedSequences::To(const c10::Device& device) const {
  return {cu_seqlens.to(device), max_seqlen, position_ids.to(device)};
}

PackedSequences PackRows(const std::vector<std::vector<int64_t>>& lengths, int64_t seq) {
  const auto rows = static_cast<int64_t>(lengths.size());
  std::vector<int32_t> offsets{0};
  PackedSequences packed;
  packed.position_ids = at::zeros({rows, seq}, at::kLong);
  int64_t* positions = packed.position_ids.data_ptr<int64_t>();
  auto add = [&](int64_t length) {
    offsets.push_back(static_cast<int32_t>(offsets.back() + length));
    packed.max_seqlen = std::max(packed.max_seqlen, length);
  };
  for (int64_t r = 0; r < rows; ++r) {
    int64_t used = 0;
    for (const int64_t length : lengths[r]) {
      if (length == 0) continue;
      TORCH_INTERNAL_ASSERT(length > 0 && used + length <= seq, "PackRows: row ", r, " overflows ",
                            seq, " tokens");
      for (int64_t j = 0; j < length; ++j) positions[r * seq + used + j] = j;
      add(length);
      used += length;
    }
    if (used < seq) add(seq - used);  // the padding, at position 0
  }
  packed.cu_seqlens = at::tensor(offsets, at::kInt);
  return packed;
}

namespace {

// Whether ATen's flash kernel takes q's variable-length attention.
bool FlashTakes(const at::Tensor& q) {
  const int64_t head_dim = q.size(-1);
  return q.is_cuda() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
         head_dim % 8 == 0 && head_dim <= 256;
}

}  // namespace

at::Tensor PackedCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const PackedSequences& packed, int64_t window) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), head_dim = q.size(3);
  if (FlashTakes(q)) {
    // THD: [batch x seq tokens, heads, head_dim]; flash's window counts the positions before.
    auto thd = [&](const at::Tensor& x) {
      return x.transpose(1, 2).reshape({batch * seq, x.size(1), head_dim});
    };
    const std::optional<int64_t> left =
        window > 0 ? std::optional<int64_t>(window - 1) : std::nullopt;
    const std::optional<int64_t> right = window > 0 ? std::optional<int64_t>(0) : std::nullopt;
    const at::Tensor out = std::get<0>(at::_flash_attention_forward(
        thd(q), thd(k), thd(v), packed.cu_seqlens, packed.cu_seqlens, packed.max_seqlen,
        packed.max_seqlen, /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false,
        /*scale=*/std::nullopt, left, right));
    return out.view({batch, seq, heads, head_dim}).transpose(1, 2);
  }
  const at::Tensor offsets = packed.cu_seqlens.to(at::kCPU, at::kLong);
  const int64_t* o = offsets.data_ptr<int64_t>();
  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i + 1 < offsets.numel(); ++i) {
    const int64_t length = o[i + 1] - o[i];
    if (length == 0) continue;
    auto part = [&](const at::Tensor& x) {
      return x.narrow(0, o[i] / seq, 1).narrow(2, o[i] % seq, length);
    };
    pieces.push_back(window > 0 ? SlidingWindowAttention(part(q), part(k), part(v), window)
                                : CausalAttention(part(q), part(k), part(v)));
  }
  // [1, heads, batch x seq, head_dim] -> [batch, heads, seq, head_dim]
  return at::cat(pieces, 2).view({heads, batch, seq, head_dim}).transpose(0, 1);
}

}  // namespace keel::base
