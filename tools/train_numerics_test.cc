// A run that really diverges (a learning rate of 1000: AdamW's decoupled weight decay then
// multiplies the weights by 1 - 1000 x 0.01 = -9 every step until they overflow), on one rank
// and on two (//tools:launch): by default it stops at the first non-finite value, exit 1,
// naming the step, the ranks and the values, with no checkpoint of that state or later, and a
// rerun resumes from the last good checkpoint; with numerics.on_nonfinite=skip the bad steps
// are dropped on every rank (no update, no learning-rate step), counted in the metrics and
// checkpoints, until too many in a row stop it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/recipe/metrics.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::recipe::StepMetrics;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<std::string> Diverging(const std::string& run_dir,
                                   const std::vector<std::string>& more = {}) {
  std::vector<std::string> assignments = {"lr_scheduler.max_lr=1000",
                                          "step_scheduler.val_every_steps=100"};
  assignments.insert(assignments.end(), more.begin(), more.end());
  return SmallRun(run_dir, /*max_steps=*/30, assignments);
}

Subprocess Start(int ranks, const std::vector<std::string>& args, const std::string& stderr_path) {
  return ranks == 1 ? StartTrain(args, stderr_path) : LaunchTrain(ranks, args, stderr_path);
}

std::string StepDir(const std::string& run_dir, int64_t step) {
  return absl::StrFormat("%s/checkpoints/step_%010d", run_dir, step);
}

// The steps of the committed checkpoints under run_dir.
std::vector<int64_t> CheckpointSteps(const std::string& run_dir) {
  std::vector<int64_t> steps;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0) steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The step a run stopped or skipped at: "step N: " before the description of what went bad.
std::optional<int64_t> BadStep(const std::string& text) {
  std::smatch match;
  if (!std::regex_search(text, match,
                         std::regex(R"(step (\d+): (the loss|the gradients|every rank))"))) {
    return std::nullopt;
  }
  return std::stoll(match[1].str());
}

class NumericsTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Ranks, NumericsTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat(info.param, "rank");
                         });

TEST_P(NumericsTest, StopsAtTheFirstNonFiniteValueAndResumesFromTheLastGoodCheckpoint) {
  const int ranks = GetParam();
  const std::string dir = NewTempDir("diverge_stop");
  Subprocess first = Start(ranks, Diverging(dir), dir + "/first.stderr");
  ASSERT_EQ(first.Wait(), 1) << first.Stderr();
  const std::string stderr_text = first.Stderr();
  const std::optional<int64_t> bad = BadStep(stderr_text);
  ASSERT_TRUE(bad.has_value()) << stderr_text;
  EXPECT_THAT(stderr_text, AllOf(HasSubstr("non-finite on rank 0 (\"nan\")"),
                                 HasSubstr("the gradient norm is \"nan\""),
                                 HasSubstr("Stopped before the optimizer step")));
  if (ranks == 2) {
    EXPECT_THAT(stderr_text, HasSubstr("rank 1 (\"nan\")"));
  }

  // Nothing of the bad step or later: the metrics end before it, finite, and every checkpoint
  // (every 3 steps) is older; the newest verifies byte for byte.
  const std::vector<StepMetrics> metrics = Metrics(dir);
  ASSERT_EQ(metrics.size(), static_cast<size_t>(*bad - 1));
  for (const StepMetrics& m : metrics) {
    EXPECT_TRUE(std::isfinite(m.loss) && std::isfinite(m.grad_norm)) << "step " << m.step;
  }
  const std::vector<int64_t> saved = CheckpointSteps(dir);
  ASSERT_FALSE(saved.empty());
  EXPECT_LT(saved.back(), *bad);
  EXPECT_EQ(saved.back(), (*bad - 1) / 3 * 3);
  EXPECT_EQ(LatestCheckpoint(dir), StepDir(dir, saved.back()));

  // A rerun resumes from that checkpoint and, deterministic, diverges at the same step again.
  Subprocess again = Start(ranks, Diverging(dir), dir + "/again.stderr");
  ASSERT_EQ(again.Wait(), 1) << again.Stderr();
  EXPECT_THAT(again.DrainStdout(), HasSubstr("resumed from " + StepDir(dir, saved.back())));
  EXPECT_EQ(BadStep(again.Stderr()), bad);
  EXPECT_EQ(CheckpointSteps(dir), saved);
}

TEST_P(NumericsTest, SkipDropsTheBadStepsOnEveryRankAndCountsThem) {
  const int ranks = GetParam();
  const std::string dir = NewTempDir("diverge_skip");
  Subprocess run = Start(
      ranks,
      Diverging(dir, {"numerics.on_nonfinite=skip", "numerics.max_consecutive_skipped_steps=3",
                      "step_scheduler.ckpt_every_steps=1"}),
      dir + "/stderr");
  ASSERT_EQ(run.Wait(), 1) << run.Stderr();
  EXPECT_THAT(run.Stderr(), HasSubstr("3 skipped steps in a row"));
  const std::optional<int64_t> last = BadStep(run.Stderr());
  ASSERT_TRUE(last.has_value());
  const int64_t first_skip = *last - 2;  // the stop comes at the third skip in a row

  // Steps first_skip and first_skip + 1 were skipped: logged with their count, the learning
  // rate not advanced by them, and their checkpoints hold the weights and optimizer state of
  // the step before (no update) and the count. A diverging run may skip a lone step and
  // recover before the streak: each such step counts too.
  const std::vector<StepMetrics> metrics = Metrics(dir);
  ASSERT_EQ(metrics.size(), static_cast<size_t>(*last - 1));
  int64_t earlier = 0;
  for (int64_t i = 0; i + 1 < first_skip; ++i) {
    earlier += !std::isfinite(metrics[i].loss) || !std::isfinite(metrics[i].grad_norm);
  }
  const StepMetrics& before = metrics[first_skip - 2];
  const StepMetrics& skipped = metrics[first_skip - 1];
  EXPECT_EQ(before.skipped_steps, earlier);
  EXPECT_EQ(skipped.skipped_steps, earlier + 1);
  EXPECT_EQ(metrics.back().skipped_steps, earlier + 2);
  EXPECT_FALSE(std::isfinite(skipped.grad_norm));
  EXPECT_EQ(metrics.back().lr, skipped.lr);
  for (int64_t step : {first_skip, first_skip + 1}) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ExpectSameModelAndOptimizer(StepDir(dir, first_skip - 1), StepDir(dir, step));
    KEEL_ASSERT_OK_AND_ASSIGN(auto reader, checkpoint::CheckpointReader::Open(StepDir(dir, step)));
    KEEL_ASSERT_OK_AND_ASSIGN(base::Json counted, reader->ReadValues("numerics"));
    EXPECT_EQ(counted["skipped_steps"], earlier + step - first_skip + 1);
  }
  EXPECT_EQ(CheckpointSteps(dir).back(), *last - 1);
}

}  // namespace
}  // namespace keel::tools
