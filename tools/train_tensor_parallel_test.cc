// //tools:train with distributed.tensor_model_parallel_size = 2, as child processes: the
// layout must not change the numbers (against the one-rank run, with data parallelism, the
// distributed optimizer and many micro-batches), checkpoints hold global tensors (they resume
// across layouts and export the one-rank model's names and shapes), and kill -9 and resume is
// bit-identical.
//
// Every run shuffles globally (sampler.shuffle_scope=global): the samples of each step are the
// same on any number of data-parallel ranks, so only the arithmetic differs between layouts.
// Each layout is held against the one-rank run of its micro-batch size: splitting a step's
// batch otherwise changes the numbers by itself (one rank, 8 micro-batches of 1 against 2 of
// 4: the gradient norm of step 28, a loss spike whose norm is 17 before clipping, by 1.05e-3
// under LibTorch 2.11). What the layout changes is the order of float32 sums:
// a row-parallel layer adds two half-sums of its products, the vocabulary-parallel loss two
// half-sums of exponentials, where one rank sums each at once. Measured over the 30 steps
// below (LibTorch 2.11): the first loss within 2.2e-8 relative, later losses within 1.5e-7,
// gradient norms within 3e-5. The test asks 1e-6 of the first loss, 1e-4 of the others and
// 1e-3 of the gradient norms.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
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

constexpr char kTp2[] = "distributed.tensor_model_parallel_size=2";

TEST(TrainTensorParallelTest, TheLayoutDoesNotChangeTheNumbers) {
  constexpr int64_t kSteps = 30;
  // The one-rank run of each micro-batch size, by its local_batch_size assignment.
  std::map<std::string, std::string> references;
  const auto reference_of = [&](const std::string& local_batch_size) {
    auto [it, inserted] = references.try_emplace(local_batch_size);
    if (inserted) {
      it->second = NewTempDir("tp_reference");
      Subprocess one = StartTrain(SameSamplesRun(it->second, kSteps, {local_batch_size}),
                                  it->second + "/stderr");
      EXPECT_EQ(one.Wait(), 0) << one.Stderr();
      EXPECT_EQ(Metrics(it->second).size(), static_cast<size_t>(kSteps));
    }
    return it->second;
  };

  struct Layout {
    std::string name;
    int ranks;
    std::vector<std::string> assignments;
    std::string local_batch_size;  // as the run and its one-rank reference have it
    std::string geometry;          // what the model line says
  };
  const std::vector<Layout> layouts = {
      {"tp2",
       2,
       {kTp2},
       "step_scheduler.local_batch_size=4",
       "2 micro-batches of 4 per rank on 1 rank(s)"},
      {"tp2_dp2_zero",
       4,
       {kTp2, "distributed.use_distributed_optimizer=true"},
       "step_scheduler.local_batch_size=4",
       "1 micro-batches of 4 per rank on 2 rank(s)"},
      {"tp2_8_micro_batches",
       2,
       {kTp2},
       "step_scheduler.local_batch_size=1",
       "8 micro-batches of 1 per rank on 1 rank(s)"},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const std::string reference = reference_of(layout.local_batch_size);
    const std::string run_dir = NewTempDir(layout.name);
    std::vector<std::string> assignments = layout.assignments;
    assignments.push_back(layout.local_batch_size);
    Subprocess child = StartOnRanks(layout.ranks, SameSamplesRun(run_dir, kSteps, assignments),
                                    run_dir + "/stderr");
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    const std::string out = child.DrainStdout();
    EXPECT_THAT(out, HasSubstr("(1/2 of most on each tensor-parallel rank)"));
    EXPECT_THAT(out, HasSubstr("; tensor-parallel collectives "));
    EXPECT_THAT(out, HasSubstr(layout.geometry));
    ExpectLayoutInvariant(reference, run_dir);
  }
}

// One run through every change of layout the issue names, 6 steps each, each leg resuming
// from the last one's final checkpoint: 1 rank, tp=2, 1 rank, tp=2, tp=2 x dp=2 (with the
// distributed optimizer). It continues the uninterrupted one-rank trace as a single run of
// any of those layouts would, and a tp=2 checkpoint exports the one-rank model's tensors.
TEST(TrainTensorParallelTest, CheckpointsResumeAcrossLayouts) {
  TensorShapes tp2_export;
  const std::string reference = ExpectResumesAcrossLayouts(
      "reshard",
      {{1, {}},
       {2, {kTp2}},
       {1, {}},
       {2, {kTp2}},
       {4, {kTp2, "distributed.use_distributed_optimizer=true"}}},
      /*steps_per_leg=*/6, [&](size_t leg, const std::string& run_dir) {
        if (leg != 3) return;
        tp2_export =
            ExportedTensors(absl::GetFlag(FLAGS_ckpt), LatestCheckpoint(run_dir), run_dir + "/hf");
      });
  // A tp=2 checkpoint exports the one-rank model's tensors: names, dtypes and whole shapes.
  const TensorShapes from_one_rank =
      ExportedTensors(absl::GetFlag(FLAGS_ckpt), LatestCheckpoint(reference), reference + "/hf");
  EXPECT_FALSE(from_one_rank.empty());
  EXPECT_EQ(tp2_export, from_one_rank);
}

// A tp=2 run, its rank group killed with SIGKILL after step 7 and after step 12 (its
// asynchronous save in flight), resumed each time: it ends as the uninterrupted tp=2 run
// does, every loss and the weights and optimizer state to the bit.
TEST(TrainTensorParallelTest, KillNineAndResumeIsBitIdentical) {
  ExpectKillNineResumesBitIdentically("tp_kill", 2, 18, [](const std::string& run_dir) {
    return SameSamplesRun(run_dir, 18, {kTp2});
  });
}

}  // namespace
}  // namespace keel::tools
