// //tools:train with distributed.use_distributed_optimizer (AdamW's state sharded over the
// data-parallel ranks), as child processes: against the unsharded run, through kill -9 and
// resume, and resumed from its checkpoints on 1 rank (unsharded) and on 4 (sharded).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/recipe/metrics.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::recipe::StepMetrics;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSharded[] = "distributed.use_distributed_optimizer=true";

// On 2 ranks the sharded run computes what the unsharded one does: the same gradient sums
// (a + b), the same elementwise AdamW on each element, the same all-gathered weights. Only
// the clipping norm (max_norm 1) is summed in float64 over the shards and then the ranks
// instead of over whole tensors, so its last bits may differ, and through the clipping factor
// a float32 rounding of some gradient. Measured with this model over 50 steps, 18 of them
// clipped: every loss the same double, gradient norms within 5e-16 relative. The test asks
// 1e-12 of both (1e-5 is what a user needs; this is what the math gives).
TEST(TrainShardedTest, MatchesTheUnshardedRunOnTwoRanks) {
  const std::string whole = NewTempDir("unsharded");
  Subprocess unsharded = LaunchTrain(2, SmallRun(whole, 12), whole + "/stderr");
  ASSERT_EQ(unsharded.Wait(), 0) << unsharded.Stderr();
  EXPECT_THAT(unsharded.DrainStdout(), HasSubstr(" parameters, AdamW; "));

  const std::string run_dir = NewTempDir("sharded");
  Subprocess sharded = LaunchTrain(2, SmallRun(run_dir, 12, {kSharded}), run_dir + "/stderr");
  ASSERT_EQ(sharded.Wait(), 0) << sharded.Stderr();
  EXPECT_THAT(sharded.DrainStdout(), HasSubstr("AdamW sharded over the data-parallel ranks ("));
  ASSERT_EQ(Metrics(whole).size(), 12u);
  ExpectCloseTrace(Metrics(whole), Metrics(run_dir), 1e-12, 1e-12);
}

// A sharded run on 2 ranks, its rank group killed with SIGKILL after step 7 and after step 12
// (its asynchronous save in flight), resumed each time: it ends as the uninterrupted sharded
// run does, every loss and the weights and optimizer state to the bit.
TEST(TrainShardedTest, KillNineAndResumeIsBitIdentical) {
  ExpectKillNineResumesBitIdentically("sharded_kill", 2, 18, [](const std::string& run_dir) {
    return SmallRun(run_dir, 18, {kSharded});
  });
}

// Sharded on 2 ranks to step 6, then on 1 rank (nothing to shard: AdamW over the whole
// parameters loads the shards' rows) to step 12, then sharded on 4 ranks to step 18: each
// leg resumes from the last one's checkpoint, and the run matches an uninterrupted one-rank
// run (the sequential sampler, micro-batches of 2) as the elastic tests' runs do.
TEST(TrainShardedTest, ShardedCheckpointsResumeOnOneRankAndShardedOnFour) {
  auto args = [](const std::string& run_dir, int64_t max_steps) {
    return SmallRun(
        run_dir, max_steps,
        {kSharded, "sampler.dataloader_type=single", "step_scheduler.local_batch_size=2"});
  };
  const std::string reference = NewTempDir("one_rank_reference");
  Subprocess uninterrupted = StartTrain(args(reference, 18), reference + "/stderr");
  ASSERT_EQ(uninterrupted.Wait(), 0) << uninterrupted.Stderr();

  const std::string run_dir = NewTempDir("sharded_elastic");
  struct Leg {
    int ranks;
    int64_t end;
    std::string optimizer;
  };
  for (const Leg& leg : {Leg{2, 6, "AdamW sharded"}, Leg{1, 12, " parameters, AdamW; "},
                         Leg{4, 18, "AdamW sharded"}}) {
    SCOPED_TRACE(absl::StrCat(leg.ranks, " rank(s) to step ", leg.end));
    const std::string stderr_path = absl::StrCat(run_dir, "/stderr.", leg.end);
    Subprocess child = leg.ranks == 1 ? StartTrain(args(run_dir, leg.end), stderr_path)
                                      : LaunchTrain(leg.ranks, args(run_dir, leg.end), stderr_path);
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    const std::string out = child.DrainStdout();
    EXPECT_THAT(out, HasSubstr(leg.optimizer));
    if (leg.end > 6) {
      EXPECT_THAT(out, HasSubstr(absl::StrCat("resumed from ", run_dir, "/checkpoints/step_",
                                              leg.end == 12 ? "0000000006" : "0000000012")));
    }
    EXPECT_THAT(out, Not(HasSubstr("warning: checkpoint")));
  }
  ASSERT_EQ(Metrics(reference).size(), 18u);
  ExpectCloseTrace(Metrics(reference), Metrics(run_dir), 1e-5, 1e-3);
}

}  // namespace
}  // namespace keel::tools
