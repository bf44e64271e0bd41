#include "gmock/gmock.h"
#include "gradients/grad_utils_cases.h"
#include "gtest/gtest.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

namespace keel::gradients {
namespace {

using ::keel::testing::LoadGoldenCases;
using ::keel::testing::MatchesGolden;

// Keel runs the same ATen ops in the same order and dtypes as NeMo on the same LibTorch
// build and CPU kernels (AVX2), so norms and clipped gradients must be bit-identical.
TEST(GradUtilsParityTest, MatchesNemoOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RunGradUtilsCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
  }
}

}  // namespace
}  // namespace keel::gradients
