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

// One block a row: each thread folds its real columns into a MaxSum (one exponential a value),
// the block combines them; thread 0 writes the row's log-normaliser and target logit.
__global__ void __launch_bounds__(kThreads)
    SliceLogNormaliser(const __nv_bfloat16* logits, const int64_t* target, int64_t columns,
                       int64_t begin, int64_t real, float* lse, float* target_logit) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * columns;
  MaxSum mine{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < real; c += blockDim.x) {
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
    // A row without a real logit (a slice of padding alone) has sum 0: log 0 = -inf.
    lse[row] = mine.max == -INFINITY ? -INFINITY : mine.max + logf(mine.sum);
    const int64_t t = target[row] - begin;
    target_logit[row] = t >= 0 && t < real ? __bfloat162float(x[t]) : 0.0f;
  }
}

// One block a row: softmax minus the target's one-hot, times the row's loss gradient, in the
// real columns; 0 in the padding ones.
__global__ void __launch_bounds__(kThreads)
    SliceGradient(const __nv_bfloat16* logits, const int64_t* target, const float* lse,
                  const float* grad_loss, int64_t columns, int64_t begin, int64_t real,
                  __nv_bfloat16* grad) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * columns;
  __nv_bfloat16* out = grad + row * columns;
  const float normaliser = lse[row], scale = grad_loss[row];
  // The target's column, if one of the real columns holds it.
  const int64_t t = target[row] - begin, hot = t >= 0 && t < real ? t : -1;
  for (int64_t c = threadIdx.x; c < columns; c += blockDim.x) {
    const float p = c < real ? expf(__bfloat162float(x[c]) - normaliser) : 0.0f;
    out[c] = __float2bfloat16((p - (c == hot ? 1.0f : 0.0f)) * scale);
  }
}

const char* LastError() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

}  // namespace

const char* LaunchSliceLogNormaliser(const void* logits, const int64_t* target, int64_t rows,
                                     int64_t columns, int64_t begin, int64_t real, float* lse,
                                     float* target_logit, void* stream) {
  SliceLogNormaliser<<<static_cast<unsigned>(rows), kThreads, 0,
                       static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), target, columns, begin, real, lse, target_logit);
  return LastError();
}

const char* LaunchSliceGradient(const void* logits, const int64_t* target, const float* lse,
                                const float* grad_loss, int64_t rows, int64_t columns,
                                int64_t begin, int64_t real, void* grad, void* stream) {
  SliceGradient<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), target, lse, grad_loss, columns, begin, real,
      static_cast<__nv_bfloat16*>(grad));
  return LastError();
}

}  // namespace keel::parallel::internal
