// Keel's CUDA kernels of the cross-entropy over a slice of bf16 logits (cross_entropy_cuda.cu,
// compiled by nvcc under --config=cuda): forward reads each row once and keeps only its float32
// log-normaliser over the slice and the target's logit; backward reads the row again and writes
// its gradient in bf16 in the same pass (llm.c's fused classifier, split at the autograd
// boundary, and over a tensor-parallel rank's slice of the vocabulary). Raw pointers and a
// cudaStream_t as void*, so that no LibTorch header meets nvcc; vocab_slice.cc adapts tensors.
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_

#include <cstdint>

namespace keel::parallel::internal {

// Row r of `rows` rows of `columns` bf16 logits starts at logits + r * columns; its column c is
// the vocabulary's entry begin + c, a real one for c < real (a padding one, which takes no part,
// after). For each row, in float32: lse[r] = log(sum of exp(logit) over the real columns; -inf
// logits take no part either) and target_logit[r] = the logit of entry target[r] if one of the
// real columns holds it, else 0. Launched on `stream`. Returns nullptr, or CUDA's message when
// the launch failed. Requires: device pointers; rows > 0; 0 <= real <= columns, columns > 0.
const char* LaunchSliceLogNormaliser(const void* logits, const int64_t* target, int64_t rows,
                                     int64_t columns, int64_t begin, int64_t real, float* lse,
                                     float* target_logit, void* stream);

// grad[r][c] = (exp(logit - lse[r]) - (begin + c == target[r])) * grad_loss[r] in the real
// columns and 0 in the padding ones, in bf16 (row r from grad + r * columns). Returns and
// requires as LaunchSliceLogNormaliser.
const char* LaunchSliceGradient(const void* logits, const int64_t* target, const float* lse,
                                const float* grad_loss, int64_t rows, int64_t columns,
                                int64_t begin, int64_t real, void* grad, void* stream);

}  // namespace keel::parallel::internal

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_INTERNAL_CROSS_ENTROPY_CUDA_H_
