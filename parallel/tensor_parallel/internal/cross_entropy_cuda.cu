#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "parallel/tensor_parallel/internal/cross_entropy_cuda.h"

namespace keel::parallel::internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarp = 32;

// A running maximum and the sum of exp(x - max) over the values seen.
struct MaxSum {
  float max;
  float sum;
};

__device__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float max = fmaxf(a.max, b.max);
  if (max == -INFINITY) return {max, 0.0f};
  return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
}

__device__ MaxSum WarpCombine(MaxSum value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, value.max, offset),
                       __shfl_xor_sync(0xffffffffu, value.sum, offset)};
    value = Combine(value, other);
  }
  return value;
}

// One block a row: each thread folds its columns into a MaxSum (one exponential a value), the
// block combines them; thread 0 writes the row's log-normaliser and loss.
__global__ void __launch_bounds__(kThreads)
    Forward(const __nv_bfloat16* logits, const int64_t* target, int64_t vocab, float* lse,
            float* loss) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * vocab;
  MaxSum mine{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float v = __bfloat162float(x[c]);
    if (v == -INFINITY) continue;
    if (v > mine.max) {
      mine.sum = mine.sum * expf(mine.max - v) + 1.0f;
      mine.max = v;
    } else {
      mine.sum += expf(v - mine.max);
    }
  }
  mine = WarpCombine(mine);
  __shared__ MaxSum warps[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warps[warp] = mine;
  __syncthreads();
  if (warp != 0) return;
  mine = lane < blockDim.x / kWarp ? warps[lane] : MaxSum{-INFINITY, 0.0f};
  mine = WarpCombine(mine);
  if (lane == 0) {
    const float normaliser = mine.max + logf(mine.sum);
    lse[row] = normaliser;
    loss[row] = normaliser - __bfloat162float(x[target[row]]);
  }
}

// One block a row: softmax minus the target's one-hot, times the row's loss gradient.
__global__ void __launch_bounds__(kThreads)
    Backward(const __nv_bfloat16* logits, const int64_t* target, const float* lse,
             const float* grad_loss, int64_t vocab, __nv_bfloat16* grad) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * vocab;
  __nv_bfloat16* out = grad + row * vocab;
  const float normaliser = lse[row], scale = grad_loss[row];
  const int64_t t = target[row];
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float p = expf(__bfloat162float(x[c]) - normaliser);
    out[c] = __float2bfloat16((p - (c == t ? 1.0f : 0.0f)) * scale);
  }
}

const char* LastError() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace

const char* LaunchCrossEntropyForward(const void* logits, const int64_t* target, int64_t rows,
                                      int64_t vocab, float* lse, float* loss, void* stream) {
  Forward<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), target, vocab, lse, loss);
  return LastError();
}

const char* LaunchCrossEntropyBackward(const void* logits, const int64_t* target, const float* lse,
                                       const float* grad_loss, int64_t rows, int64_t vocab,
                                       void* grad, void* stream) {
  Backward<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), target, lse, grad_loss, vocab,
      static_cast<__nv_bfloat16*>(grad));
  return LastError();
}

}  // namespace keel::parallel::internal
