// A step's scaling divides by the ranks that average the gradients (data x context parallel),
// not by the data-parallel ranks alone, and moves to NeMo's PP scaling over pipeline stages.
#include "tools/recipe/stages.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/moe/token_dispatcher.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "tools/recipe/runtime_testutil.h"

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
  parallel::ModelParallelOptions cp2;
  cp2.context_parallel_size = 2;
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh, GlooMesh(r, cp2));
    TrainRuntime runtime;
    AttachMesh(mesh, at::kCPU, runtime);
    EXPECT_EQ(runtime.dp_size, 1);
    const StepScaling averaged = ScaleStep(200, 4, runtime);
    EXPECT_DOUBLE_EQ(averaged.loss_scale, 2.0 / 200);
    EXPECT_EQ(averaged.gradients.dp_group_size, 2);
    EXPECT_EQ(averaged.gradients.num_label_tokens, 200);
    return absl::OkStatus();
  }));
  // Over pipeline stages the loss is summed as it is, and PP scaling divides the gradients by
  // label_tokens / 2 after; each load-balancing loss is weighed to match.
  parallel::ModelParallelOptions cp2_pp2 = cp2;
  cp2_pp2.pipeline_model_parallel_size = 2;
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(4, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(const parallel::DeviceMesh mesh, GlooMesh(r, cp2_pp2));
    TrainRuntime runtime;
    AttachMesh(mesh, at::kCPU, runtime);
    const StepScaling pipelined = ScaleStep(200, 4, runtime);
    EXPECT_DOUBLE_EQ(pipelined.loss_scale, 1.0);
    EXPECT_TRUE(pipelined.gradients.pp_enabled);
    EXPECT_EQ(pipelined.gradients.dp_group_size, 2);
    EXPECT_DOUBLE_EQ(pipelined.aux_loss_scale, 100.0 / 4);
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::tools::recipe
