#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduling/step_scheduler_cases.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

namespace keel::scheduling {
namespace {

using ::keel::testing::LoadGoldenCases;
using ::keel::testing::MatchesGolden;

// Every recorded value is an integer or a boolean: exact equality.
TEST(StepSchedulerParityTest, MatchesNemoOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RunStepSchedulerCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
  }
}

}  // namespace
}  // namespace keel::scheduling
