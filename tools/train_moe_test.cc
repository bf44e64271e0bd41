// //tools:train with a mixture-of-experts GPT (4 experts a block, 2 per token, the
// load-balancing loss at 0.01), as child processes: expert parallelism must not change the
// numbers (ep=2 on 2 ranks, ep=2 on 4 ranks with 2 expert data-parallel replicas, 8
// micro-batches), checkpoints hold the experts under their global index (they resume across
// expert-parallel sizes), kill -9 and resume is bit-identical, and bad geometry exits 2.
//
// Every run shuffles globally (sampler.shuffle_scope=global): each step's samples are the same
// on any number of ranks. Megatron's load-balancing loss is one micro-batch's, so each layout is
// compared with the one-rank run of the same micro-batch size. What differs is the order of
// float32 sums (an expert's gradient gathers the tokens of both expert-parallel ranks, then
// NeMo's EP scaling divides it by the data-parallel size over the expert data-parallel one).
// Measured over the 30 steps below: the first loss the same float, later losses within 1e-7
// relative, gradient norms within 1e-6. The test asks 1e-6 of the first loss, 1e-4 of the
// others and 1e-3 of the gradient norms.
#include <signal.h>

#include <cstdint>
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
using ::testing::HasSubstr;

constexpr char kEp2[] = "distributed.expert_model_parallel_size=2";

// The MoE model, and `more`.
std::vector<std::string> Moe(std::vector<std::string> more = {}) {
  more.insert(more.begin(), {"model.num_moe_experts=4", "model.moe_router_topk=2",
                             "model.moe_aux_loss_coeff=0.01"});
  return more;
}

std::string LocalBatch(int64_t size) {
  return absl::StrCat("step_scheduler.local_batch_size=", size);
}

TEST(TrainMoeTest, ExpertParallelismDoesNotChangeTheNumbers) {
  constexpr int64_t kSteps = 30;
  struct Layout {
    std::string name;
    int ranks;
    int64_t local_batch_size;  // of the layout and of its one-rank reference
    std::vector<std::string> assignments;
    std::string geometry;  // what the model line says
  };
  const std::vector<Layout> layouts = {
      {"ep2", 2, 4, {kEp2}, "1 micro-batches of 4 per rank on 2 rank(s)"},
      {"ep2_expert_dp2", 4, 2, {kEp2}, "1 micro-batches of 2 per rank on 4 rank(s)"},
      {"ep2_8_micro_batches",
       2,
       1,
       {kEp2, "step_scheduler.global_batch_size=16"},
       "8 micro-batches of 1 per rank on 2 rank(s)"},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    std::vector<std::string> reference_args = Moe({LocalBatch(layout.local_batch_size)});
    std::vector<std::string> args = Moe(layout.assignments);
    args.push_back(LocalBatch(layout.local_batch_size));
    if (layout.name == "ep2_8_micro_batches") {
      reference_args.push_back("step_scheduler.global_batch_size=16");
    }
    const std::string reference = NewTempDir(layout.name + "_reference");
    Subprocess one =
        StartTrain(SameSamplesRun(reference, kSteps, reference_args), reference + "/stderr");
    ASSERT_EQ(one.Wait(), 0) << one.Stderr();
    const std::string run_dir = NewTempDir(layout.name);
    Subprocess child =
        StartOnRanks(layout.ranks, SameSamplesRun(run_dir, kSteps, args), run_dir + "/stderr");
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    EXPECT_THAT(child.DrainStdout(), HasSubstr(layout.geometry));
    ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(kSteps));
    ExpectLayoutInvariant(reference, run_dir);
    // The metrics count every routed token once: samples x 64 tokens x 2 experts x 2 blocks,
    // as the one-rank run does.
    for (const auto& [expected, actual] : {std::pair{Metrics(reference)[0], Metrics(run_dir)[0]}}) {
      ASSERT_TRUE(actual.tokens_per_expert.has_value());
      int64_t routed = 0;
      for (const int64_t tokens : *actual.tokens_per_expert) routed += tokens;
      EXPECT_EQ(routed, (layout.name == "ep2_8_micro_batches" ? 16 : 8) * 64 * 2 * 2);
      EXPECT_EQ(actual.tokens_per_expert, expected.tokens_per_expert);
      ASSERT_TRUE(actual.moe_aux_loss.has_value());
      EXPECT_NEAR(*actual.moe_aux_loss, *expected.moe_aux_loss, 1e-6 * *expected.moe_aux_loss);
    }
  }
}

// One run through 1 rank, ep=2, 1 rank, ep=4 (one expert a rank) and ep=2, 6 steps each (no
// load-balancing loss: the legs split the batch into other micro-batches), continuing the
// uninterrupted one-rank trace.
TEST(TrainMoeTest, CheckpointsResumeAcrossExpertParallelSizes) {
  ExpectResumesAcrossLayouts("moe_reshard",
                             {{1, {}},
                              {2, {kEp2}},
                              {1, {}},
                              {4, {"distributed.expert_model_parallel_size=4", LocalBatch(2)}},
                              {2, {kEp2}}},
                             /*steps_per_leg=*/6, [](size_t, const std::string&) {},
                             {"model.num_moe_experts=4", "model.moe_router_topk=2"});
}

// An ep=2 run, its ranks killed with SIGKILL after step 7 and after step 12, resumed each
// time: it ends as the uninterrupted ep=2 run does, to the bit.
TEST(TrainMoeTest, KillNineAndResumeIsBitIdentical) {
  constexpr int64_t kSteps = 18;
  const std::vector<std::string> args = Moe({kEp2});
  const std::string reference = NewTempDir("moe_kill_reference");
  Subprocess uninterrupted =
      LaunchTrain(2, SameSamplesRun(reference, kSteps, args), reference + "/stderr");
  ASSERT_EQ(uninterrupted.Wait(), 0) << uninterrupted.Stderr();
  const std::string run_dir = NewTempDir("moe_kill");
  int run = 0;
  for (const int64_t kill_after : {7, 12}) {
    SCOPED_TRACE(absl::StrCat("killed after step ", kill_after));
    Subprocess child = LaunchTrain(2, SameSamplesRun(run_dir, kSteps, args),
                                   absl::StrCat(run_dir, "/stderr.", ++run));
    ASSERT_TRUE(ReadUntilStep(child, kill_after)) << child.Stderr();
    child.KillGroup(SIGKILL);
    EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  }
  Subprocess last = LaunchTrain(2, SameSamplesRun(run_dir, kSteps, args),
                                absl::StrCat(run_dir, "/stderr.", ++run));
  ASSERT_EQ(last.Wait(), 0) << last.Stderr();
  EXPECT_THAT(last.DrainStdout(), HasSubstr("resumed from "));
  ExpectSameTrace(Metrics(reference), Metrics(run_dir));
  ExpectSameWeights(LatestCheckpoint(reference), LatestCheckpoint(run_dir));
}

TEST(TrainMoeTest, BadGeometryExitsTwoNamingTheNumbers) {
  struct Case {
    int ranks;
    std::vector<std::string> assignments;
    std::string message;
  };
  const std::vector<Case> cases = {
      {2,
       {"model.num_moe_experts=3", kEp2},
       "distributed.expert_model_parallel_size (2) must divide model.num_moe_experts (3)"},
      {1,
       {"model.num_moe_experts=4", "model.moe_router_topk=5"},
       "model.moe_router_topk (5) must be in [1, model.num_moe_experts (4)]"},
      {2, {kEp2}, "distributed.expert_model_parallel_size (2) needs model.num_moe_experts > 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const std::string run_dir = NewTempDir("moe_bad");
    Subprocess child =
        StartOnRanks(c.ranks, SameSamplesRun(run_dir, 4, c.assignments), run_dir + ".stderr");
    EXPECT_EQ(child.Wait(), 2) << child.Stderr();
    EXPECT_THAT(child.Stderr(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace keel::tools
