#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/param_scheduler_cases.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

namespace keel::optim {
namespace {

using ::keel::testing::LoadGoldenCases;
using ::keel::testing::MatchesGolden;

// Every value is computed with Megatron's operations in Megatron's order on IEEE doubles
// with the same libm (glibc), so the schedules must agree bit for bit: 0 ulps.
TEST(ParamSchedulerParityTest, MatchesMegatronOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RunParamSchedulerCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
  }
}

}  // namespace
}  // namespace keel::optim
