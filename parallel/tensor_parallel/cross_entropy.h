// Cross-entropy over logits whose vocabulary is split across a tensor-parallel group, after
// Megatron-Core's tensor_parallel/cross_entropy.py (vocab_parallel_cross_entropy): each rank
// holds the logits of its slice of the vocabulary ([..., vocab / tp], rank r's slice starting
// at r x vocab / tp); each slice's log-normaliser and target logit are reduced over the group,
// so no rank ever holds the whole logits (two all-reduces, where Megatron's three reduce the
// maximum logit, the target's and the sum of exponentials; the same loss within float
// rounding). Its gradient is computed directly (softmax minus the target's one-hot, on each
// rank's slice) from the logits kept in their dtype. On one rank, ATen's fused log-softmax does
// the arithmetic in fewer passes. bf16 logits on a GPU, in a build with --config=cuda
// (KEEL_CUDA_KERNELS), take Keel's kernels on any number of ranks, chunked or not: they read
// the logits once forward and once backward, writing the gradient in the same pass.
//
//   at::Tensor logits = lm_head(hidden);                       // [b, s, vocab / tp]
//   at::Tensor losses = VocabParallelCrossEntropy(logits, labels, tp);  // [b, s]
//   (losses * loss_mask).sum().backward();
//
// LinearCrossEntropy is the output layer and the loss together, over chunks of positions, so
// that no more than a chunk's logits ever exist (AutoModel's FusedLinearCrossEntropy, after
// Apple's cut cross-entropy; torchtune's chunked output):
//
//   at::Tensor losses = LinearCrossEntropy(CopyToTensorParallelRegion(hidden, tp),
//                                          lm_head_weight, labels, tp,
//                                          LinearCrossEntropyOptions{/*chunk_len=*/1024});
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_

#include <cstdint>
#include <optional>

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

// `logits` ([..., vocab / tp], this rank's slice) with its columns from `real_columns` on (the
// padding rows of a vocabulary padded for tensor parallelism) set to -inf, so that they take no
// part in the softmax; `logits` itself when every column is real (nullopt, or at least the
// slice's width).
at::Tensor WithoutPadding(const at::Tensor& logits, std::optional<int64_t> real_columns);

struct LinearCrossEntropyOptions {
  // Positions whose logits exist at once (AutoModel's ChunkedCrossEntropy chunk_len): forward
  // computes each chunk's logits and log-normaliser and frees them; backward computes each
  // chunk's logits again for its gradients (one more output-layer GEMM a step, and the memory of
  // [chunk_len, vocab / tp] float32 logits in place of the whole micro-batch's). 0: all positions
  // at once, as the output layer and VocabParallelCrossEntropy compute them. Default: 0.
  int64_t chunk_len = 0;
  // As WithoutPadding's: the real columns of this rank's slice. Default: all.
  std::optional<int64_t> real_columns;
};

// VocabParallelCrossEntropy(WithoutPadding(hidden · weightᵀ, real_columns), target, group): the
// float32 losses at each position ([...], target's shape), the logits in `hidden`'s dtype.
// `hidden` ([..., h]) is the input region of a column-parallel output layer (whole on every rank
// of `group`: after CopyToTensorParallelRegion), `weight` ([vocab / tp, h]) this rank's slice;
// the gradient this rank returns for `hidden` is its slice's part, which the region's backward
// sums over the group. Differentiable in `hidden` and `weight`; with a chunk_len the weight's
// gradient is accumulated in float32 over the chunks (into its main gradient where a sync
// offers one, parallel/main_grad.h) and the losses equal the whole logits' within float
// rounding. Collective as VocabParallelCrossEntropy. Requires: as it, and `hidden`
// and `weight` of one dtype and device, chunk_len >= 0.
at::Tensor LinearCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& target, c10d::ProcessGroup* group,
                              const LinearCrossEntropyOptions& options);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_CROSS_ENTROPY_H_
