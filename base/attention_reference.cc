#include "base/attention_reference.h"

#include <cmath>
#include <limits>

#include "ATen/ATen.h"

namespace keel::base {

at::Tensor CausalAttentionExplicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t seq = q.size(-2);
  const at::Tensor above_diagonal =
      at::ones({seq, seq}, q.options().dtype(at::kBool)).triu(/*diagonal=*/1);
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  return at::matmul(
      at::softmax(scores.masked_fill(above_diagonal, -std::numeric_limits<float>::infinity()), -1),
      v);
}

}  // namespace keel::base
