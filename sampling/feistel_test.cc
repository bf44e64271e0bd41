#include "sampling/internal/feistel.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::sampling::internal {
namespace {

// Whether `p` maps [0, n) onto [0, n).
bool IsPermutation(const FeistelPermutation& p) {
  std::vector<bool> hit(p.size(), false);
  for (uint64_t i = 0; i < p.size(); ++i) {
    const uint64_t image = p(i);
    if (image >= p.size() || hit[image]) return false;
    hit[image] = true;
  }
  return true;
}

TEST(FeistelPermutationTest, IsAPermutationOfEverySmallSize) {
  for (uint64_t seed : {0ULL, 1ULL, 0xdeadbeefULL, ~0ULL}) {
    for (uint64_t n = 1; n <= 1100; ++n) {
      ASSERT_TRUE(IsPermutation(FeistelPermutation(n, seed))) << "n=" << n << " seed=" << seed;
    }
  }
}

TEST(FeistelPermutationTest, IsAPermutationOfLargerSizes) {
  // Powers of two and their neighbours exercise the domain rounding.
  for (uint64_t n :
       {(1ULL << 16) - 1, 1ULL << 16, (1ULL << 16) + 1, 100003ULL, 1ULL << 21, (1ULL << 21) + 7}) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(IsPermutation(FeistelPermutation(n, /*seed=*/42)));
  }
}

TEST(FeistelPermutationTest, HandlesTheWholeUint64Domain) {
  // n > 2^63: 64-bit domain, no cycle walking overflow.
  const FeistelPermutation p(~0ULL, /*seed=*/9);
  for (uint64_t i : {0ULL, 1ULL, 1ULL << 63, ~0ULL - 1}) EXPECT_LT(p(i), p.size());
  const FeistelPermutation q(1ULL << 63, /*seed=*/9);
  for (uint64_t i : {0ULL, 12345ULL, (1ULL << 63) - 1}) EXPECT_LT(q(i), q.size());
}

TEST(FeistelPermutationTest, SeedsGiveDifferentOrders) {
  std::vector<uint64_t> a;
  std::vector<uint64_t> b;
  const FeistelPermutation p(1000, /*seed=*/1);
  const FeistelPermutation q(1000, /*seed=*/2);
  for (uint64_t i = 0; i < 1000; ++i) {
    a.push_back(p(i));
    b.push_back(q(i));
  }
  EXPECT_NE(a, b);
}

// Pearson's chi-square of the ordered pairs (p(0), p(1)) over 200·n·(n-1) seeds against the
// uniform distribution: a good shuffle stays near its n·(n-1) - 1 degrees of freedom. The
// seeds are fixed, so this cannot flake. The bound is 5 standard deviations above the mean;
// four rounds, or no minimum domain, exceed it by far (e.g. 432 for n = 5 against 50).
void ExpectFirstPairUniform(uint64_t n) {
  const uint64_t cells = n * (n - 1);
  std::vector<int64_t> counts(n * n, 0);
  for (uint64_t seed = 0; seed < 200 * cells; ++seed) {
    const FeistelPermutation p(n, seed);
    ++counts[p(0) * n + p(1)];
  }
  double chi2 = 0;
  for (uint64_t first = 0; first < n; ++first) {
    EXPECT_EQ(counts[first * n + first], 0);
    for (uint64_t second = 0; second < n; ++second) {
      if (first == second) continue;
      const double d = static_cast<double>(counts[first * n + second]) - 200.0;
      chi2 += d * d / 200.0;
    }
  }
  const double dof = static_cast<double>(cells - 1);
  EXPECT_LT(chi2, dof + 5 * std::sqrt(2 * dof)) << "n=" << n;
}

TEST(FeistelPermutationTest, FirstTwoImagesAreUniformOverSeeds) {
  for (uint64_t n : {2, 5, 16, 100}) ExpectFirstPairUniform(n);
}

}  // namespace
}  // namespace keel::sampling::internal
