// NonFiniteGuard on its own: finite values step; a non-finite loss or gradient norm stops the
// run with a message naming the step, the ranks and the values, or under "skip" drops steps
// until too many in a row; the counters go into checkpoints, and checkpoints without them load.
#include "tools/recipe/numerics.h"

#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/state_dict.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "tools/recipe/runtime_testutil.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Verdict = NonFiniteGuard::Verdict;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TrainRuntime Alone(std::ostream& log) {
  TrainRuntime runtime;
  runtime.log = &log;
  return runtime;
}

// One rank's contribution: its loss; its gradients are the reduced ones.
NonFiniteGuard::Local OneRank(double loss) {
  NonFiniteGuard::Local local;
  local.loss = loss;
  return local;
}

TEST(NonFiniteGuardTest, FiniteValuesStepAndTheCheckCanBeTurnedOff) {
  std::ostringstream log;
  NonFiniteGuard guard{NumericsOptions{}};
  KEEL_ASSERT_OK_AND_ASSIGN(Verdict verdict, guard.Check(3, 2.5, 0.7, OneRank(40.0), Alone(log)));
  EXPECT_EQ(verdict, Verdict::kStep);
  NumericsOptions off;
  off.check_for_nan_in_loss_and_grad = false;
  NonFiniteGuard unchecked(off);
  KEEL_ASSERT_OK_AND_ASSIGN(verdict, unchecked.Check(3, kNan, kInf, OneRank(kNan), Alone(log)));
  EXPECT_EQ(verdict, Verdict::kStep);
}

TEST(NonFiniteGuardTest, StopNamesTheStepTheRankAndTheValues) {
  std::ostringstream log;
  NonFiniteGuard guard{NumericsOptions{}};
  EXPECT_THAT(guard.Check(14, kNan, kNan, OneRank(kNan), Alone(log)),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("step 14: the loss is non-finite on rank 0 (\"nan\"); "
                                       "the gradients are non-finite on rank 0 (\"nan\"); the "
                                       "gradient norm is \"nan\""),
                             HasSubstr("Stopped before the optimizer step"),
                             HasSubstr("the newest one is the last good state"))));
  EXPECT_THAT(guard.Check(15, 3.0, kInf, OneRank(30.0), Alone(log)),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("step 15: the gradients are non-finite on rank 0 (\"inf\"); the "
                                 "gradient norm is \"inf\"")));
}

TEST(NonFiniteGuardTest, SkipCountsAndStopsAfterTooManyInARow) {
  std::ostringstream log;
  NumericsOptions options;
  options.on_nonfinite = NonFinitePolicy::kSkip;
  options.max_consecutive_skipped_steps = 3;
  NonFiniteGuard guard(options);
  KEEL_ASSERT_OK_AND_ASSIGN(Verdict verdict, guard.Check(1, kNan, kNan, OneRank(kNan), Alone(log)));
  EXPECT_EQ(verdict, Verdict::kSkip);
  KEEL_ASSERT_OK_AND_ASSIGN(verdict, guard.Check(2, 1.0, 1.0, OneRank(1.0), Alone(log)));
  EXPECT_EQ(verdict, Verdict::kStep);  // a good step ends the run of skips
  for (int64_t step : {3, 4}) {
    KEEL_ASSERT_OK_AND_ASSIGN(verdict, guard.Check(step, kNan, kNan, OneRank(kNan), Alone(log)));
    EXPECT_EQ(verdict, Verdict::kSkip);
  }
  EXPECT_EQ(guard.state().skipped_steps, 3);
  EXPECT_EQ(guard.state().consecutive_skipped_steps, 2);
  EXPECT_THAT(log.str(), HasSubstr("warning: step 4: the loss is non-finite on rank 0"));
  EXPECT_THAT(
      guard.Check(5, kNan, kNan, OneRank(kNan), Alone(log)),
      StatusIs(absl::StatusCode::kAborted, HasSubstr("3 skipped steps in a row "
                                                     "(numerics.max_consecutive_skipped_steps)")));
}

// Three ranks, the loss non-finite on ranks 1 and 2 and the gradients on rank 2 only (a
// gradient that overflowed in backward): every rank names them.
TEST(NonFiniteGuardTest, EveryRankNamesTheRanksWhoseLossOrGradientsWentBad) {
  std::vector<absl::Status> statuses(3);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(3, [&](keel::testing::Rank& r) -> absl::Status {
    std::ostringstream log;
    KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh, GlooMesh(r));
    TrainRuntime runtime;
    AttachMesh(mesh, at::kCPU, runtime);
    runtime.log = &log;
    NonFiniteGuard guard{NumericsOptions{}};
    NonFiniteGuard::Local local;
    local.loss = r.rank == 0 ? 12.0 : r.rank == 1 ? kNan : -kInf;
    local.gradient_sum = at::full({}, r.rank == 2 ? kNan : 0.5, at::kDouble);
    statuses[r.rank] = guard.Check(7, kNan, kNan, local, runtime).status();
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kAborted,
                                 HasSubstr("step 7: the loss is non-finite on rank 1 (\"nan\"), "
                                           "rank 2 (\"-inf\"); the gradients are non-finite on "
                                           "rank 2 (\"nan\"); the gradient norm is \"nan\"")));
  }
}

TEST(NonFiniteGuardTest, CountersRoundTripAndAnOlderCheckpointMeansNoSkips) {
  std::ostringstream log;
  NumericsOptions options;
  options.on_nonfinite = NonFinitePolicy::kSkip;
  NonFiniteGuard source(options);
  KEEL_ASSERT_OK(source.Check(1, kNan, kNan, OneRank(kNan), Alone(log)).status());
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::State saved, source.StateDict());

  NonFiniteGuard target(options);
  KEEL_ASSERT_OK(
      checkpoint::LoadFromMemory({{"numerics", &target}}, {{"numerics", saved}}, {}).status());
  EXPECT_EQ(target.state().skipped_steps, 1);
  EXPECT_EQ(target.state().consecutive_skipped_steps, 1);

  // Written before Keel counted skips: nothing under "numerics", and the load is clean.
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::LoadReport report,
                            checkpoint::LoadFromMemory({{"numerics", &target}}, {}, {}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_EQ(target.state().skipped_steps, 0);
}

}  // namespace
}  // namespace keel::tools::recipe
