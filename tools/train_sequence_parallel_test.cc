// //tools:train with distributed.sequence_parallel (Megatron's sequence parallelism) at
// tensor_model_parallel_size 2, as child processes: the run follows the tp=2 run without it
// within the bounds the tensor-parallel runs keep from the one-rank run (ExpectLayoutInvariant:
// 1e-6 of the first loss, 1e-4 of the others, 1e-3 of the gradient norms; every step's norm also
// checked against the gradient blocks counted once, clip_grad.check_norm_every_steps), for the
// GPT and a Hugging Face Llama, through two pipeline stages, with the distributed optimizer,
// under LoRA, on packed conversations and with experts (split over tp, or whole over ep); full
// recomputation leaves its trace bit-identical; what it cannot take is refused by name; rank 0's
// peak of live tensors is lower with it. Sequence parallelism changes the order of float32 sums
// (each norm's and row-parallel bias's gradient summed from two halves of the sequence, the
// weights' gradients from a gathered input), not what is summed: measured under LibTorch 2.11,
// the first losses equal, later ones within 5.3e-8 relative, gradient norms within 7.3e-7.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/sft_testutil.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::cli::With;
using ::testing::HasSubstr;

constexpr char kTp2[] = "distributed.tensor_model_parallel_size=2";
constexpr char kSequenceParallel[] = "distributed.sequence_parallel=true";

// `common` at tp=2 on `ranks` ranks for `steps` steps, into a new directory named after `name`
// (with sequence parallelism if `sequence_parallel`); the run's directory.
std::string RunTp2(const std::string& name, int ranks, int64_t steps,
                   const std::vector<std::string>& common, bool sequence_parallel) {
  const std::string run_dir = NewTempDir(name);
  const std::vector<std::string> layout = sequence_parallel
                                              ? std::vector<std::string>{kTp2, kSequenceParallel}
                                              : std::vector<std::string>{kTp2};
  Subprocess run = StartOnRanks(ranks, SameSamplesRun(run_dir, steps, With(common, layout)),
                                run_dir + "/stderr");
  EXPECT_EQ(run.Wait(), 0) << run.Stderr();
  if (sequence_parallel) {
    EXPECT_THAT(run.DrainStdout(), HasSubstr("(1/2 of most on each tensor-parallel rank, and 1/2 "
                                             "of each sequence between its layers)"));
  }
  return run_dir;
}

// The run of `common` with sequence parallelism follows the one without and holds fewer bytes
// of tensors at its peak (rank 0's); its directory.
std::string ExpectSequenceParallelFollowsTp2(int ranks, int64_t steps,
                                             const std::vector<std::string>& common) {
  const std::string plain = RunTp2("tp2", ranks, steps, common, /*sequence_parallel=*/false);
  const std::string split = RunTp2("tp2_sp", ranks, steps, common, /*sequence_parallel=*/true);
  ExpectLayoutInvariant(plain, split);
  EXPECT_LT(PeakTensorMemoryGib(split), PeakTensorMemoryGib(plain));
  return split;
}

TEST(TrainSequenceParallelTest, TheGptFollowsTensorParallelism) {
  ExpectSequenceParallelFollowsTp2(2, 12, {});
}

// tp=2 x dp=2 with the distributed optimizer: each rank sums its shards of the norms' gradients
// with its tensor-parallel peer's, which cover the same elements.
TEST(TrainSequenceParallelTest, TheDistributedOptimizersShardsFollowTensorParallelism) {
  ExpectSequenceParallelFollowsTp2(4, 8, {"distributed.use_distributed_optimizer=true"});
}

// Llama's embedding reduce-scatters its output, the RMSNorms see half of each sequence, the
// untied output layer gathers it. Full recomputation runs the layers' gathers and
// reduce-scatters again in the backward pass: the trace is the same doubles.
TEST(TrainSequenceParallelTest, TheLlamaFollowsTensorParallelismAndRecomputesToTheBit) {
  const std::vector<std::string> llama = PretrainedRun("llama_gqa_untied");
  const std::string split = ExpectSequenceParallelFollowsTp2(2, 12, llama);
  const std::string recomputed =
      RunTp2("tp2_sp_recomputed", 2, 12,
             With(llama, {"model.recompute_granularity=full", "model.recompute_method=uniform",
                          "model.recompute_num_layers=1"}),
             /*sequence_parallel=*/true);
  ExpectSameTrace(Metrics(split), Metrics(recomputed));
}

// pp=2 x tp=2 on 4 ranks: the stages pass each other half of every sequence.
TEST(TrainSequenceParallelTest, PipelineStagesPassHalfSequences) {
  ExpectSequenceParallelFollowsTp2(
      4, 8,
      With(PretrainedRun("llama_gqa_untied"), {"distributed.pipeline_model_parallel_size=2"}));
}

// LoRA on every projection: a column layer's A and a row layer's B see half of each sequence and
// have their gradients summed over the tensor-parallel ranks.
TEST(TrainSequenceParallelTest, LoraAdaptersFollowTensorParallelism) {
  ExpectSequenceParallelFollowsTp2(
      2, 8,
      With(PretrainedRun("llama_gqa_untied"),
           {"peft.dim=4", "peft.alpha=8", "lr_scheduler.max_lr=1e-2", "lr_scheduler.min_lr=1e-3"}));
}

// Packed conversations: the attention, after the gather, runs over each whole row and keeps
// every conversation to itself.
TEST(TrainSequenceParallelTest, PackedConversationsFollowTensorParallelism) {
  std::vector<TestConversation> conversations;
  for (int copy = 0; copy < 4; ++copy) {
    for (const TestConversation& c : ReadSftFixture().conversations) conversations.push_back(c);
  }
  const std::string prefix = WriteConversations("fixture_copies", conversations);
  ExpectSequenceParallelFollowsTp2(
      2, 4,
      With(PretrainedRun("llama_gqa_untied"),
           {"data.prefix=" + prefix, "data.format=sft", "data.sequence_length=32",
            "data.validation_every_n_samples=0", "packed_sequence.packed_sequence_size=64",
            "step_scheduler.global_batch_size=2", "step_scheduler.local_batch_size=2"}));
}

// A mixture of experts (4 a block, 2 a token, the load-balancing loss at 0.01; train_moe_test's
// peak learning rate of 1e-3): its blocks gather the whole sequence, route it as without
// sequence parallelism and give back this rank's half. With the experts split over tp, one
// reduce-scatter sums their parts; with whole experts over ep=2 (expert tp 1), each rank keeps
// its half of the outputs.
TEST(TrainSequenceParallelTest, MixturesOfExpertsFollowTensorParallelism) {
  const std::vector<std::string> moe = {
      "model.num_moe_experts=4", "model.moe_router_topk=2",   "model.moe_aux_loss_coeff=0.01",
      "optimizer.lr=0.001",      "lr_scheduler.max_lr=0.001", "lr_scheduler.min_lr=0.0001"};
  {
    SCOPED_TRACE("experts split over tp");
    ExpectSequenceParallelFollowsTp2(2, 8, moe);
  }
  {
    SCOPED_TRACE("whole experts over ep=2");
    ExpectSequenceParallelFollowsTp2(4, 8,
                                     With(moe, {"distributed.expert_model_parallel_size=2",
                                                "distributed.expert_tensor_parallel_size=1"}));
  }
}

TEST(TrainSequenceParallelTest, WhatItCannotTakeIsRefusedByName) {
  const std::string run_dir = NewTempDir("refused");
  ExpectRefused(1, {kSequenceParallel},
                "distributed.sequence_parallel (true) splits the sequence over the "
                "tensor-parallel ranks, and distributed.tensor_model_parallel_size is 1",
                run_dir + "/tp1");
  ExpectRefused(1, {kTp2, kSequenceParallel, "data.sequence_length=63"},
                "data.sequence_length (63) must be divisible by "
                "distributed.tensor_model_parallel_size (2) with distributed.sequence_parallel",
                run_dir + "/length");
}

}  // namespace
}  // namespace keel::tools
