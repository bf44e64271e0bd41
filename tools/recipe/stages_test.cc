// A step's scaling divides by the ranks that average the gradients (data x context parallel),
// not by the data-parallel ranks alone, and moves to NeMo's PP scaling over pipeline stages.
#include "tools/recipe/stages.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/moe/token_dispatcher.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::Rank;

TEST(ScaleStepTest, DividesByTheRanksTheGradientsAreAveragedOver) {
  // One rank: the mean over 200 label tokens.
  const StepScaling alone = ScaleStep(200, 4, TrainRuntime());
  EXPECT_DOUBLE_EQ(alone.loss_scale, 1.0 / 200);
  EXPECT_DOUBLE_EQ(alone.aux_loss_scale, 1.0 / 4);
  EXPECT_FALSE(alone.gradients.pp_enabled);
  EXPECT_EQ(alone.gradients.dp_group_size, 1);
  EXPECT_EQ(alone.gradients.ep_axis_name, parallel::kExpertDim);
  // Gradients averaged over 2 ranks that are one data-parallel rank (context parallelism's
  // dp x cp group): each rank's loss counts twice, before the average halves it.
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [](Rank& r) -> absl::Status {
    TrainRuntime runtime;
    runtime.rank = r.rank;
    runtime.world_size = 2;
    runtime.group = r.group.get();
    const StepScaling averaged = ScaleStep(200, 4, runtime);
    EXPECT_DOUBLE_EQ(averaged.loss_scale, 2.0 / 200);
    EXPECT_EQ(averaged.gradients.dp_group_size, 2);
    EXPECT_EQ(averaged.gradients.num_label_tokens, 200);
    // Over pipeline stages the loss is summed as it is, and PP scaling divides the gradients
    // by label_tokens / 2 after; each load-balancing loss is weighed to match.
    runtime.pp_group = r.group.get();
    const StepScaling pipelined = ScaleStep(200, 4, runtime);
    EXPECT_DOUBLE_EQ(pipelined.loss_scale, 1.0);
    EXPECT_TRUE(pipelined.gradients.pp_enabled);
    EXPECT_DOUBLE_EQ(pipelined.aux_loss_scale, 100.0 / 4);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::tools::recipe
