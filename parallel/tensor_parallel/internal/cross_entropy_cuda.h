// Keel's CUDA kernels of the one-rank cross-entropy over bf16 logits (cross_entropy_cuda.cu,
// compiled by nvcc under --config=cuda): forward reads each row of logits once and keeps only
// its float32 log-normaliser; backward reads the row again and writes its gradient in bf16 in the
// same pass (llm.c's fused classifier, split at the autograd boundary). Raw pointers and a
// cudaStream_t as void*, so that no LibTorch header meets nvcc; cross_entropy.cc adapts tensors.
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_

#include <cstdint>

namespace keel::parallel::internal {

// For each of `rows` rows of `vocab` bf16 logits (row r from logits + r * vocab): lse[r] =
// log(sum(exp(logits[r]))) and loss[r] = lse[r] - logits[r][target[r]], in float32; -inf logits
// (padding columns) take no part. Launched on `stream`. Returns nullptr, or CUDA's message when
// the launch failed. Requires: device pointers; target[r] in [0, vocab); rows > 0, vocab > 0.
const char* LaunchCrossEntropyForward(const void* logits, const int64_t* target, int64_t rows,
                                      int64_t vocab, float* lse, float* loss, void* stream);

// grad[r][c] = (exp(logits[r][c] - lse[r]) - (c == target[r])) * grad_loss[r], in bf16 (row r
// from grad + r * vocab). Returns and requires as LaunchCrossEntropyForward.
const char* LaunchCrossEntropyBackward(const void* logits, const int64_t* target, const float* lse,
                                       const float* grad_loss, int64_t rows, int64_t vocab,
                                       void* grad, void* stream);

}  // namespace keel::parallel::internal

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_
