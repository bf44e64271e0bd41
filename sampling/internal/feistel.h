// A seeded bijection of [0, n) evaluated one index at a time, in O(1) memory: the random
// sampler's memory-flat permutation (RandomPermutation::kFeistel).
#ifndef KEEL_SAMPLING_INTERNAL_FEISTEL_H_
#define KEEL_SAMPLING_INTERNAL_FEISTEL_H_

#include <array>
#include <cstdint>

namespace keel::sampling::internal {

// An unbalanced Feistel network over the smallest power-of-two domain holding [0, n) (and at
// least 2^8), made a permutation of [0, n) by cycle walking: an image >= n is permuted again
// until it falls in range. For n > 128 the domain is less than 2n, so a lookup averages under
// two network evaluations. Six rounds of a 64-bit multiply-xorshift function keyed from
// `seed`: a statistical shuffle, not a cryptographic one. Fewer rounds, or halves narrower
// than 4 bits, measurably bias which pairs of images come first (see feistel_test.cc).
class FeistelPermutation {
 public:
  // Requires: n >= 1.
  FeistelPermutation(uint64_t n, uint64_t seed);

  // The image of `index`. Requires: index < n.
  uint64_t operator()(uint64_t index) const {
    uint64_t x = Network(index);
    while (x >= n_) x = Network(x);
    return x;
  }

  uint64_t size() const { return n_; }

 private:
  static constexpr int kRounds = 6;
  static constexpr int kMinBits = 8;

  // One pass of the network over [0, 2^bits): a bijection of that domain.
  uint64_t Network(uint64_t x) const {
    int high_bits = high_bits_;
    int low_bits = bits_ - high_bits_;
    for (const uint64_t key : keys_) {
      // x = high | low; the next x = low | (high ^ F(low)), so the two widths swap.
      const uint64_t low = x & Mask(low_bits);
      const uint64_t high = x >> low_bits;
      x = (low << high_bits) | ((high ^ Mix(low ^ key)) & Mask(high_bits));
      const int swapped = high_bits;
      high_bits = low_bits;
      low_bits = swapped;
    }
    return x;
  }

  static uint64_t Mask(int bits) { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }

  // A 64-bit finalizer (the variant from splitmix64): every input bit affects every output bit.
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  uint64_t n_;
  int bits_;
  int high_bits_;
  std::array<uint64_t, kRounds> keys_;
};

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_FEISTEL_H_
