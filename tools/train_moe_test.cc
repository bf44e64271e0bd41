// //tools:train with a mixture-of-experts GPT (4 experts a block, 2 per token, the
// load-balancing loss at 0.01), as child processes: expert parallelism must not change the
// numbers (ep=2 on 2 ranks, ep=2 on 4 ranks with 2 expert data-parallel replicas, 8
// micro-batches; tp=2 x ep=2, pp=2 x ep=2, ep=2 on 4 ranks with the distributed optimizer,
// tp=2 with whole experts, with and without ep=2),
// checkpoints hold the experts under their global index (they resume across expert- and
// tensor-parallel sizes, pipeline stages and sharded optimizer state), kill -9 and resume is
// bit-identical, and bad geometry exits 2.
//
// Every run shuffles globally (sampler.shuffle_scope=global): each step's samples are the same
// on any number of ranks. Megatron's load-balancing loss is one micro-batch's, so each layout is
// compared with the one-rank run of the same micro-batch size. What differs is the order of
// float32 sums: with one micro-batch a rank, every gradient is a sum of two terms in both runs
// and ep=2 follows the one-rank trace to 1e-11; with 8 micro-batches a rank (or 4 ranks) the
// sums associate differently and the runs differ by 1e-8 relative.
//
// The runs peak at a learning rate of 1e-3, not the recipe's 3e-3: at 3e-3 this router trains
// through loss spikes (the gradient norm jumps from 0.6 to 23 in one step), and a spike
// amplifies any 1e-8 difference to percent level, whatever made it (data parallelism without
// experts split, dp=2 ep=1, parts from the one-rank run at the same spike). Measured at 1e-3
// over the 30 steps below: first losses the same float, later losses within 1.2e-7 relative,
// gradient norms within 1e-6. The test asks 1e-6 of the first loss, 1e-4 of the others and
// 1e-3 of the gradient norms.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
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
using ::testing::HasSubstr;

constexpr char kEp2[] = "distributed.expert_model_parallel_size=2";
constexpr char kPp2[] = "distributed.pipeline_model_parallel_size=2";
constexpr char kTp2[] = "distributed.tensor_model_parallel_size=2";
constexpr char kZero[] = "distributed.use_distributed_optimizer=true";
constexpr char kExpertTp1[] = "distributed.expert_tensor_parallel_size=1";

// The MoE model at a peak learning rate of 1e-3.
std::vector<std::string> MoeModel() {
  return {"model.num_moe_experts=4", "model.moe_router_topk=2", "optimizer.lr=0.001",
          "lr_scheduler.max_lr=0.001", "lr_scheduler.min_lr=0.0001"};
}

// The MoE model with the load-balancing loss at 0.01, and `more`.
std::vector<std::string> Moe(std::vector<std::string> more = {}) {
  std::vector<std::string> assignments = MoeModel();
  assignments.push_back("model.moe_aux_loss_coeff=0.01");
  assignments.insert(assignments.end(), more.begin(), more.end());
  return assignments;
}

std::string LocalBatch(int64_t size) {
  return absl::StrCat("step_scheduler.local_batch_size=", size);
}

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> common;  // for the layout and its one-rank reference
  std::vector<std::string> assignments;
  std::string geometry;  // what the model line says
  int64_t samples = 8;   // a step's
};

// Each layout's 30 steps beside its one-rank reference's (ExpectLayoutInvariant), and the first
// step's routing statistics: every routed token counted once (samples x 64 tokens x 2 experts
// x 2 blocks) and the same load-balancing loss.
void ExpectLayoutsMatchOneRank(const std::vector<Layout>& layouts) {
  constexpr int64_t kSteps = 30;
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    std::vector<std::string> args = Moe(layout.common);
    const std::string reference = NewTempDir(layout.name + "_reference");
    Subprocess one = StartTrain(SameSamplesRun(reference, kSteps, args), reference + "/stderr");
    ASSERT_EQ(one.Wait(), 0) << one.Stderr();
    args.insert(args.end(), layout.assignments.begin(), layout.assignments.end());
    const std::string run_dir = NewTempDir(layout.name);
    Subprocess child =
        StartOnRanks(layout.ranks, SameSamplesRun(run_dir, kSteps, args), run_dir + "/stderr");
    ASSERT_EQ(child.Wait(), 0) << child.Stderr();
    EXPECT_THAT(child.DrainStdout(), HasSubstr(layout.geometry));
    ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(kSteps));
    ExpectLayoutInvariant(reference, run_dir);
    const StepMetrics expected = Metrics(reference)[0];
    const StepMetrics actual = Metrics(run_dir)[0];
    ASSERT_TRUE(actual.tokens_per_expert.has_value());
    int64_t routed = 0;
    for (const int64_t tokens : *actual.tokens_per_expert) routed += tokens;
    EXPECT_EQ(routed, layout.samples * 64 * 2 * 2);
    EXPECT_EQ(actual.tokens_per_expert, expected.tokens_per_expert);
    ASSERT_TRUE(actual.moe_aux_loss.has_value());
    EXPECT_NEAR(*actual.moe_aux_loss, *expected.moe_aux_loss, 1e-6 * *expected.moe_aux_loss);
  }
}

TEST(TrainMoeTest, ExpertParallelismDoesNotChangeTheNumbers) {
  ExpectLayoutsMatchOneRank({
      {"ep2", 2, {LocalBatch(4)}, {kEp2}, "1 micro-batches of 4 per rank on 2 rank(s)"},
      {"ep2_expert_dp2", 4, {LocalBatch(2)}, {kEp2}, "1 micro-batches of 2 per rank on 4 rank(s)"},
      {"ep2_8_micro_batches",
       2,
       {LocalBatch(1), "step_scheduler.global_batch_size=16"},
       {kEp2},
       "8 micro-batches of 1 per rank on 2 rank(s)",
       16},
  });
}

TEST(TrainMoeTest, ExpertParallelismWithTheOtherLayoutsDoesNotChangeTheNumbers) {
  ExpectLayoutsMatchOneRank({
      {"tp2_ep2", 4, {LocalBatch(4)}, {kTp2, kEp2}, "1 micro-batches of 4 per rank on 2 rank(s)"},
      {"pp2_ep2", 4, {LocalBatch(2)}, {kPp2, kEp2}, "2 micro-batches of 2 per rank on 2 rank(s)"},
      {"ep2_expert_dp2_distributed_optimizer",
       4,
       {LocalBatch(2)},
       {kEp2, kZero},
       "1 micro-batches of 2 per rank on 4 rank(s)"},
      // Whole experts beside split dense layers: each tensor-parallel rank's copy of a token
      // reaches them (Megatron's expert_tensor_parallel_size).
      {"tp2_expert_tp1",
       2,
       {LocalBatch(8)},
       {kTp2, kExpertTp1},
       "1 micro-batches of 8 per rank on 1 rank(s)"},
      {"tp2_ep2_expert_tp1",
       4,
       {LocalBatch(4)},
       {kTp2, kEp2, kExpertTp1},
       "1 micro-batches of 4 per rank on 2 rank(s)"},
  });
}

// One run through 1 rank, ep=2, 1 rank, pp=2 x ep=2, tp=2 x ep=2, the same with whole experts,
// ep=4 (one expert a rank) with the distributed optimizer, and ep=2, 6 steps each (no
// load-balancing loss: the legs split the batch into other micro-batches), continuing the
// uninterrupted one-rank trace.
TEST(TrainMoeTest, CheckpointsResumeAcrossExpertParallelSizes) {
  ExpectResumesAcrossLayouts(
      "moe_reshard",
      {{1, {}},
       {2, {kEp2}},
       {1, {}},
       {4, {kEp2, kPp2, LocalBatch(2)}},
       {4, {kTp2, kEp2}},
       {4, {kTp2, kEp2, kExpertTp1}},
       {4, {"distributed.expert_model_parallel_size=4", kZero, LocalBatch(2)}},
       {2, {kEp2}}},
      /*steps_per_leg=*/6, [](size_t, const std::string&) {}, MoeModel());
}

// The checkpoint at `path` holds each rank's generator as its own row of rng/cpu (rank r's at
// row r): none is saved once as if replicated and restored on another rank (Megatron-LM #6858
// restored expert-parallel RNG streams from another rank's).
void ExpectRngRowPerRank(const std::string& path, int64_t ranks) {
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::Manifest manifest, checkpoint::ReadManifest(path));
  for (const auto& tensor : manifest.tensors()) {
    if (tensor.name() != "rng/cpu") continue;
    EXPECT_EQ(tensor.shape(0), ranks);
    std::vector<std::pair<int64_t, int64_t>> rows;  // (offset, length) of each chunk
    for (const auto& chunk : tensor.chunks()) rows.emplace_back(chunk.offsets(0), chunk.lengths(0));
    std::sort(rows.begin(), rows.end());
    std::vector<std::pair<int64_t, int64_t>> expected;
    for (int64_t rank = 0; rank < ranks; ++rank) expected.emplace_back(rank, 1);
    EXPECT_EQ(rows, expected);
    return;
  }
  ADD_FAILURE() << "no rng/cpu in " << path;
}

// An ep=2 run, its ranks killed with SIGKILL after step 7 and after step 12, resumed each
// time: it ends as the uninterrupted ep=2 run does, to the bit, its checkpoints holding each
// rank's generator as its own row.
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
  ExpectRngRowPerRank(LatestCheckpoint(run_dir), 2);
}

// LoRA on a mixture-of-experts model: adapters on the attention's linear layers, the router and
// the experts frozen with the rest. ep=2 follows the one-rank run, and the checkpoint holds the
// adapters alone.
TEST(TrainMoeTest, LoraAdaptsTheAttentionAndFreezesTheExperts) {
  constexpr int64_t kSteps = 10;
  const std::vector<std::string> lora =
      Moe({"peft.dim=4", "peft.target_modules=*.qkv,*.proj", LocalBatch(4)});
  const std::string reference = NewTempDir("moe_lora_reference");
  Subprocess one = StartTrain(SameSamplesRun(reference, kSteps, lora), reference + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();
  EXPECT_THAT(one.DrainStdout(),
              HasSubstr("model: 8 LoRA adapter tensors (the rest frozen), 3072 trainable "
                        "parameters"));
  const std::string run_dir = NewTempDir("moe_lora");
  Subprocess two =
      LaunchTrain(2, SameSamplesRun(run_dir, kSteps, cli::With(lora, {kEp2})), run_dir + "/stderr");
  ASSERT_EQ(two.Wait(), 0) << two.Stderr();
  ExpectLayoutInvariant(reference, run_dir);
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::Manifest manifest,
                            checkpoint::ReadManifest(LatestCheckpoint(run_dir)));
  std::vector<std::string> model_tensors;
  for (const auto& tensor : manifest.tensors()) {
    if (absl::StartsWith(tensor.name(), "model/")) model_tensors.push_back(tensor.name());
  }
  EXPECT_EQ(model_tensors.size(), 8u);
  for (const std::string& name : model_tensors) EXPECT_THAT(name, HasSubstr("lora_"));
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
      {2,
       {"model.num_moe_experts=4", "distributed.expert_tensor_parallel_size=2"},
       "distributed.expert_tensor_parallel_size (2) must divide "
       "distributed.tensor_model_parallel_size (1): an expert's ranks hold the same tokens, those "
       "of one tensor-parallel group; sizes that do: 1"},
      {2,
       {kTp2, kExpertTp1},
       "distributed.expert_tensor_parallel_size (1) needs model.num_moe_experts > 0 (experts to "
       "split); allowed: unset"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    ExpectRefused(c.ranks, c.assignments, c.message, NewTempDir("moe_bad"));
  }
}

}  // namespace
}  // namespace keel::tools
