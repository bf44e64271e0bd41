#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/samplers_cases.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::LoadGoldenCases;
using ::keel::testing::MatchesGolden;

// Indices and lengths are integers, and the random permutations come from the same LibTorch
// randperm kernel and generator as the reference's: 0 ulps.
TEST(SamplersParityTest, MatchesNemoOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RunSamplersCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
  }
}

}  // namespace
}  // namespace keel::sampling
