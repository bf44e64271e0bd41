#include "gradients/internal/norm_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ATen/Parallel.h"
#include "c10/util/BFloat16.h"

namespace keel::gradients::internal {
namespace {

// The loops below are also compiled for AVX2 (eight float lanes), chosen at load time where
// the CPU has it. Their values do not depend on the vector width: each element's operations
// are IEEE-exact per lane, and the lanes of a sum are fixed by index, not by the width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KEEL_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KEEL_VECTOR_CLONES
#endif

// Elements per parallel task: large enough to amortize a task, small enough for two cores.
constexpr int64_t kGrain = int64_t{1} << 16;
// Elements per float32 partial sum of BFloat16SumOfSquares.
constexpr int64_t kBlock = 8192;
// Independent float32 accumulators per block: the compiler keeps them in vector registers.
constexpr int kLanes = 16;

float FromBFloat16Bits(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// The float32 sum of squares of n <= kBlock bfloat16 values, in kLanes interleaved lanes.
KEEL_VECTOR_CLONES float BlockSumOfSquares(const uint16_t* bits, int64_t n) {
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float x = FromBFloat16Bits(bits[i + j]);
      lanes[j] += x * x;
    }
  }
  for (; i < n; ++i) {
    const float x = FromBFloat16Bits(bits[i]);
    lanes[i % kLanes] += x * x;
  }
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

KEEL_VECTOR_CLONES void ScaledSquaresRange(const float* in, float scale, double* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float quotient = std::fabs(in[i]) / scale;
    out[i] = static_cast<double>(quotient * quotient);
  }
}

}  // namespace

void ScaledSquares(const at::Tensor& g, float scale, double* out) {
  const float* in = g.data_ptr<float>();
  at::parallel_for(0, g.numel(), kGrain, [in, scale, out](int64_t begin, int64_t end) {
    ScaledSquaresRange(in + begin, scale, out + begin, end - begin);
  });
}

double BFloat16SumOfSquares(const at::Tensor& g) {
  static_assert(sizeof(c10::BFloat16) == sizeof(uint16_t));
  const auto* bits = reinterpret_cast<const uint16_t*>(g.data_ptr<c10::BFloat16>());
  const int64_t n = g.numel();
  std::vector<double> blocks((n + kBlock - 1) / kBlock);
  at::parallel_for(0, static_cast<int64_t>(blocks.size()), kGrain / kBlock,
                   [&](int64_t begin, int64_t end) {
                     for (int64_t b = begin; b < end; ++b) {
                       const int64_t first = b * kBlock;
                       blocks[b] = BlockSumOfSquares(bits + first, std::min(kBlock, n - first));
                     }
                   });
  double sum = 0.0;
  for (double block : blocks) sum += block;
  return sum;
}

}  // namespace keel::gradients::internal
