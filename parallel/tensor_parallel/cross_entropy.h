// Cross-entropy over logits whose vocabulary is split across a tensor-parallel group, after
// Megatron-Core's tensor_parallel/cross_entropy.py (vocab_parallel_cross_entropy): each rank
// holds the logits of its slice of the vocabulary ([..., vocab / tp], rank r's slice starting
// at r x vocab / tp); the maximum, the sum of exponentials and the target's logit are reduced
// over the group, so no rank ever holds the whole logits. Its gradient is computed directly
// (softmax minus the target's one-hot, on each rank's slice). On one rank, ATen's fused
// log-softmax does the same arithmetic in fewer passes.
//
//   at::Tensor logits = lm_head(hidden);                       // [b, s, vocab / tp]
//   at::Tensor losses = VocabParallelCrossEntropy(logits, labels, tp);  // [b, s]
//   (losses * loss_mask).sum().backward();
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_

#include "ATen/core/Tensor.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

// Per-position float32 losses (the shape of `target`): log(sum(exp(logits))) - logits[target],
// computed in float32 whatever the logits' dtype (Megatron's cross-entropy over bf16 logits);
// the gradient comes back in the logits' dtype. Differentiable in `logits`. `group` nullptr or
// of one rank: the whole vocabulary on one rank (no collective).
// Collective: over `group`, forward and backward (throws c10::Error when it fails, see
// mappings.h). Requires: `target` int64 of logits' shape without the last dimension, values in
// [0, vocab).
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     c10d::ProcessGroup* group);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_
