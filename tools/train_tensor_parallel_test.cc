// //tools:train with distributed.tensor_model_parallel_size = 2, as child processes: the
// layout must not change the numbers (against the one-rank run, with data parallelism, the
// distributed optimizer and many micro-batches), checkpoints hold global tensors (they resume
// across layouts and export the one-rank model's names and shapes), and kill -9 and resume is
// bit-identical.
//
// Every run shuffles globally (sampler.shuffle_scope=global): the samples of each step are the
// same on any number of data-parallel ranks, so only the arithmetic differs between layouts.
// What differs is the order of float32 sums: a row-parallel layer adds two half-sums of its
// products, the vocabulary-parallel loss two half-sums of exponentials, where one rank sums
// each at once. Measured over the 30 steps below: the first loss the same float, later losses
// within 1.3e-6 relative, gradient norms within 2e-4 (on a step whose norm is 17 before
// clipping, where the float32 differences of ~1e-6 in the weights show most). The test asks
// 1e-6 of the first loss, 1e-4 of the others and 1e-3 of the gradient norms.
#include <signal.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/recipe/metrics.h"
#include "tools/train_testutil.h"

ABSL_FLAG(std::string, ckpt, "", "Path of //tools:ckpt.");

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kTp2[] = "distributed.tensor_model_parallel_size=2";

std::vector<std::string> Args(const std::string& run_dir, int64_t max_steps,
                              std::vector<std::string> more = {}) {
  more.insert(more.begin(), "sampler.shuffle_scope=global");
  return SmallRun(run_dir, max_steps, more);
}

// The trainer on `ranks` ranks (1: alone, without a launcher).
Subprocess Start(int ranks, const std::vector<std::string>& args, const std::string& stderr_path) {
  return ranks == 1 ? StartTrain(args, stderr_path) : LaunchTrain(ranks, args, stderr_path);
}

// The run's trace matches the one-rank run's within the bounds the file comment gives.
void ExpectLayoutInvariant(const std::string& reference, const std::string& run_dir) {
  const std::vector<recipe::StepMetrics> expected = Metrics(reference);
  const std::vector<recipe::StepMetrics> actual = Metrics(run_dir);
  ASSERT_FALSE(expected.empty());
  ASSERT_FALSE(actual.empty());
  EXPECT_NEAR(actual[0].loss, expected[0].loss, 1e-6 * expected[0].loss);
  ExpectCloseTrace(expected, actual, 1e-4, 1e-3);
}

TEST(TrainTensorParallelTest, TheLayoutDoesNotChangeTheNumbers) {
  constexpr int64_t kSteps = 30;
  const std::string reference = NewTempDir("tp_reference");
  Subprocess one = StartTrain(Args(reference, kSteps), reference + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();
  ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(kSteps));

  struct Layout {
    std::string name;
    int ranks;
    std::vector<std::string> assignments;
    std::string geometry;  // what the model line says
  };
  const std::vector<Layout> layouts = {
      {"tp2", 2, {kTp2}, "2 micro-batches of 4 per rank on 1 rank(s)"},
      {"tp2_dp2_zero",
       4,
       {kTp2, "distributed.use_distributed_optimizer=true"},
       "1 micro-batches of 4 per rank on 2 rank(s)"},
      {"tp2_8_micro_batches",
       2,
       {kTp2, "step_scheduler.local_batch_size=1"},
       "8 micro-batches of 1 per rank on 1 rank(s)"},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const std::string run_dir = NewTempDir(layout.name);
    Subprocess child =
        Start(layout.ranks, Args(run_dir, kSteps, layout.assignments), run_dir + "/stderr");
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    const std::string out = child.DrainStdout();
    EXPECT_THAT(out, HasSubstr("(1/2 of most on each tensor-parallel rank)"));
    EXPECT_THAT(out, HasSubstr("; tensor-parallel collectives "));
    EXPECT_THAT(out, HasSubstr(layout.geometry));
    ExpectLayoutInvariant(reference, run_dir);
  }
}

// Tensors by name: dtype and shape.
using TensorShapes = std::map<std::string, std::pair<int, std::vector<int64_t>>>;

// Every tensor `ckpt export-safetensors` writes for `checkpoint` into `out`.
TensorShapes Exported(const std::string& checkpoint, const std::string& out) {
  Subprocess child = Subprocess::Start(
      {Absolute(absl::GetFlag(FLAGS_ckpt)), "export-safetensors", checkpoint, out},
      ChildOptions(out + ".stderr"));
  EXPECT_EQ(child.Wait(), 0) << child.Stderr();
  TensorShapes tensors;
  for (const auto& file : std::filesystem::directory_iterator(out)) {
    if (file.path().extension() != ".safetensors") continue;
    absl::StatusOr<checkpoint::SafetensorsHeader> header =
        checkpoint::ReadSafetensorsHeader(file.path().string());
    EXPECT_TRUE(header.ok()) << header.status();
    if (!header.ok()) continue;
    for (const checkpoint::SafetensorsEntry& e : header->entries) {
      tensors[e.name] = {static_cast<int>(e.dtype), e.shape};
    }
  }
  return tensors;
}

// One run through every change of layout the issue names, 6 steps each, each leg resuming
// from the last one's final checkpoint: 1 rank, tp=2, 1 rank, tp=2, tp=2 x dp=2 (with the
// distributed optimizer). It continues the uninterrupted one-rank trace as a single run of
// any of those layouts would, and a tp=2 checkpoint exports the one-rank model's tensors.
TEST(TrainTensorParallelTest, CheckpointsResumeAcrossLayouts) {
  constexpr int64_t kStepsPerLeg = 6;
  struct Leg {
    int ranks;
    std::vector<std::string> assignments;
  };
  const std::vector<Leg> legs = {
      {1, {}},
      {2, {kTp2}},
      {1, {}},
      {2, {kTp2}},
      {4, {kTp2, "distributed.use_distributed_optimizer=true"}},
  };
  const int64_t steps = kStepsPerLeg * static_cast<int64_t>(legs.size());
  const std::string reference = NewTempDir("reshard_reference");
  Subprocess one = StartTrain(Args(reference, steps), reference + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();

  const std::string run_dir = NewTempDir("reshard");
  TensorShapes tp2_export;
  for (size_t i = 0; i < legs.size(); ++i) {
    const int64_t end = kStepsPerLeg * static_cast<int64_t>(i + 1);
    SCOPED_TRACE(absl::StrCat("leg ", i, ": ", legs[i].ranks, " rank(s) to step ", end));
    Subprocess child = Start(legs[i].ranks, Args(run_dir, end, legs[i].assignments),
                             absl::StrCat(run_dir, "/stderr.", i));
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    const std::string out = child.DrainStdout();
    if (i > 0) {
      EXPECT_THAT(out, HasSubstr(absl::StrFormat("resumed from %s/checkpoints/step_%010d", run_dir,
                                                 end - kStepsPerLeg)));
    }
    EXPECT_THAT(out, Not(HasSubstr("warning: checkpoint")));
    if (i == 3) tp2_export = Exported(LatestCheckpoint(run_dir), run_dir + "/hf");
  }
  ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(steps));
  ExpectCloseTrace(Metrics(reference), Metrics(run_dir), 1e-4, 1e-3);

  // A tp=2 checkpoint exports the one-rank model's tensors: names, dtypes and whole shapes.
  const auto from_one_rank = Exported(LatestCheckpoint(reference), reference + "/hf");
  EXPECT_FALSE(from_one_rank.empty());
  EXPECT_EQ(tp2_export, from_one_rank);
}

// A tp=2 run, its rank group killed with SIGKILL after step 7 and after step 12 (its
// asynchronous save in flight), resumed each time: it ends as the uninterrupted tp=2 run
// does, every loss and the weights and optimizer state to the bit.
TEST(TrainTensorParallelTest, KillNineAndResumeIsBitIdentical) {
  constexpr int64_t kSteps = 18;
  const std::string reference = NewTempDir("tp_kill_reference");
  Subprocess uninterrupted = LaunchTrain(2, Args(reference, kSteps, {kTp2}), reference + "/stderr");
  ASSERT_EQ(uninterrupted.Wait(), 0) << uninterrupted.Stderr();

  const std::string run_dir = NewTempDir("tp_kill");
  int run = 0;
  for (const int64_t kill_after : {7, 12}) {
    SCOPED_TRACE(absl::StrCat("killed after step ", kill_after));
    Subprocess child =
        LaunchTrain(2, Args(run_dir, kSteps, {kTp2}), absl::StrCat(run_dir, "/stderr.", ++run));
    ASSERT_TRUE(ReadUntilStep(child, kill_after)) << child.Stderr();
    child.KillGroup(SIGKILL);
    EXPECT_EQ(child.Wait(), 128 + SIGKILL);
    LatestCheckpoint(run_dir);  // what the next run loads verifies
  }
  Subprocess last =
      LaunchTrain(2, Args(run_dir, kSteps, {kTp2}), absl::StrCat(run_dir, "/stderr.", ++run));
  ASSERT_EQ(last.Wait(), 0) << last.Stderr();
  EXPECT_THAT(last.DrainStdout(), HasSubstr("resumed from "));
  ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(kSteps));
  ExpectSameTrace(Metrics(reference), Metrics(run_dir));
  ExpectSameWeights(LatestCheckpoint(reference), LatestCheckpoint(run_dir));
}

}  // namespace
}  // namespace keel::tools
