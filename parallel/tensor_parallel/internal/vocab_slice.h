// The cross-entropy's two passes over one rank's slice of the vocabulary, for the
// vocabulary-parallel loss and the chunked output layer (cross_entropy.cc), which reduce the
// slices' log-normalisers over the tensor-parallel group between them. bf16 logits on a GPU, in
// a build with --config=cuda (KEEL_CUDA_KERNELS), take Keel's kernels (cross_entropy_cuda.h);
// everything else ATen's composition, computed in float32.
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_VOCAB_SLICE_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_VOCAB_SLICE_H_

#include <cstdint>

#include "ATen/core/Tensor.h"

namespace keel::parallel::internal {

// Which entries of the vocabulary a rank's logits [rows, columns] hold: column c is entry
// begin + c, a real entry for c < real and a padding one (no part in the softmax) after.
struct VocabSlice {
  int64_t begin = 0;
  int64_t real = 0;
};

// Per row, float32 [rows]: log(sum of exp(logit)) over the slice's real columns (-inf for a
// row with none), and the target's logit where the slice holds the target (else 0).
struct SliceLogNormaliser {
  at::Tensor lse;
  at::Tensor target_logit;
};

// Whether `logits` take Keel's kernels in this build (bf16 on a GPU under --config=cuda).
bool TakesKernels(const at::Tensor& logits);

// `logits` with columns from `real` on set to -inf; `logits` itself when there are none.
at::Tensor MaskPadding(const at::Tensor& logits, int64_t real);

// Requires: `logits` [rows, columns]; `target` int64 [rows], entries of the whole vocabulary;
// 0 <= slice.real <= columns.
SliceLogNormaliser LogNormaliser(const at::Tensor& logits, const at::Tensor& target,
                                 const VocabSlice& slice);

// d loss / d logits in the logits' dtype: (softmax - one_hot(target)) times `grad_loss` (float32
// [rows]) in the real columns, from the whole vocabulary's log-normaliser `lse` (float32 [rows]);
// 0 in the padding columns. Requires: as LogNormaliser.
at::Tensor SoftmaxMinusTarget(const at::Tensor& logits, const at::Tensor& target,
                              const VocabSlice& slice, const at::Tensor& lse,
                              const at::Tensor& grad_loss);

}  // namespace keel::parallel::internal

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_VOCAB_SLICE_H_
