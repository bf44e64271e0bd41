// tools:launch --max_restarts with the trainer: a rank killed with SIGKILL mid-run, twice, on 2
// ranks; the launcher restarts every rank each time, they resume from the newest verified
// checkpoint, and the run ends as an uninterrupted one does, every loss and the weights to the
// bit, the restarts and their cause recorded in metrics.jsonl. With --max_restarts=0 the first
// kill ends the launch.
#include <signal.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
using ::testing::HasSubstr;

constexpr int64_t kSteps = 20;

// The run of `run_dir`, its checkpoints saved synchronously: once a rank prints step N, the
// checkpoint of every step before it is on disk, so the steps the ranks resume at are known
// (an asynchronous save may still be writing when the kill lands, and the ranks then resume
// from the one before, as train_test's kill tests check).
std::vector<std::string> SynchronousSavesRun(const std::string& run_dir) {
  return SameSamplesRun(run_dir, kSteps, {"checkpoint.is_async=false"});
}

// The launcher's children (its ranks), in the order it started them.
std::vector<pid_t> Children(pid_t launcher) {
  std::ifstream in(absl::StrCat("/proc/", launcher, "/task/", launcher, "/children"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<pid_t> pids;
  for (absl::string_view field : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    pid_t pid;
    if (absl::SimpleAtoi(field, &pid)) pids.push_back(pid);
  }
  return pids;
}

TEST(TrainRestartTest, KilledRanksRestartAndEndBitIdentical) {
  const std::string reference = NewTempDir("restart_reference");
  Subprocess uninterrupted = LaunchTrain(2, SynchronousSavesRun(reference), reference + "/stderr");
  ASSERT_EQ(uninterrupted.Wait(), 0) << uninterrupted.Stderr();

  const std::string run_dir = NewTempDir("restart");
  Subprocess launch =
      LaunchTrain(2, SynchronousSavesRun(run_dir), run_dir + "/stderr", {"--max_restarts=3"});
  // Checkpoints every 3 steps: killed after step 7, the ranks resume after step 6; killed
  // after step 14 (counted again from 7), after step 12.
  for (const int64_t kill_after : {7, 14}) {
    ASSERT_TRUE(ReadUntilStep(launch, kill_after)) << launch.Stderr();
    const std::vector<pid_t> ranks = Children(launch.pid());
    ASSERT_EQ(ranks.size(), 2u);
    ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  }
  ASSERT_EQ(launch.Wait(), 0) << launch.Stderr();
  EXPECT_THAT(launch.Stderr(), HasSubstr("launch: restarting every rank (restart 2 of at most "
                                         "3): rank 1 killed by signal 9"));
  const std::vector<recipe::StepMetrics> metrics = Metrics(run_dir);
  ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(kSteps));
  ExpectSameTrace(Metrics(reference), metrics);
  ExpectSameWeights(LatestCheckpoint(reference), LatestCheckpoint(run_dir));
  std::vector<int64_t> restarted_at;
  for (const recipe::StepMetrics& m : metrics) {
    if (!m.restart_count.has_value()) continue;
    restarted_at.push_back(m.step);
    EXPECT_EQ(m.restart_cause, "rank 1 killed by signal 9");
    EXPECT_EQ(*m.restart_count, static_cast<int64_t>(restarted_at.size()));
  }
  EXPECT_THAT(restarted_at, ::testing::ElementsAre(7, 13));
}

TEST(TrainRestartTest, WithoutRestartsTheFirstKillEndsTheLaunch) {
  const std::string run_dir = NewTempDir("no_restart");
  Subprocess launch =
      LaunchTrain(2, SameSamplesRun(run_dir, kSteps), run_dir + "/stderr", {"--max_restarts=0"});
  ASSERT_TRUE(ReadUntilStep(launch, 5)) << launch.Stderr();
  const std::vector<pid_t> ranks = Children(launch.pid());
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(kill(ranks[1], SIGKILL), 0);
  EXPECT_EQ(launch.Wait(), 128 + SIGKILL);
  EXPECT_THAT(launch.Stderr(), ::testing::Not(HasSubstr("restarting")));
}

}  // namespace
}  // namespace keel::tools
