#include "sampling/internal/feistel.h"

#include <algorithm>

namespace keel::sampling::internal {
namespace {

// The smallest b with 2^b >= n.
int CeilLog2(uint64_t n) { return n <= 1 ? 0 : 64 - __builtin_clzll(n - 1); }

}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t seed)
    : n_(n), bits_(std::max(kMinBits, CeilLog2(n))), high_bits_((bits_ + 1) / 2) {
  // Round keys: consecutive outputs of a splitmix64 stream started at `seed`.
  uint64_t state = seed;
  for (uint64_t& key : keys_) {
    state += 0x9e3779b97f4a7c15ULL;
    key = Mix(state);
  }
}

}  // namespace keel::sampling::internal
