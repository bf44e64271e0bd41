// //tools:train with activation recomputation (model.recompute_granularity), as child processes:
// the loss, learning-rate, gradient-norm and validation trace is bit-identical to the run
// without it for both families, in float32 and Megatron's bf16, "full" ("uniform" and "block") and
// "selective" (every module), under LoRA (the frozen embedding's output needs no gradient: the trap
// of re-entrant checkpointing), at tp=2 and pp=2, and with a mixture of experts over ep=2 (its
// load-balancing loss and statistics once per step), while rank 0 holds fewer bytes of tensors at
// its peak; Megatron-Core's checks on the fields are errors naming them.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::cli::With;

const std::vector<std::string> kUniform = {"model.recompute_granularity=full",
                                           "model.recompute_method=uniform",
                                           "model.recompute_num_layers=1"};
const std::vector<std::string> kBlock = {"model.recompute_granularity=full",
                                         "model.recompute_method=block",
                                         "model.recompute_num_layers=1"};
const std::vector<std::string> kSelective = {"model.recompute_granularity=selective",
                                             "model.recompute_modules=core_attn,mlp,layernorm"};

// Runs `common` (6 steps, validating every 3) on `ranks` ranks
// without and with each recomputation; the traces are the same doubles, and rank 0 holds fewer
// bytes of tensors at its peak.
void ExpectRecomputationChangesNothing(int ranks, const std::vector<std::string>& common) {
  const std::vector<std::string> validating = With(common, {"step_scheduler.val_every_steps=3"});
  const std::string plain = NewTempDir("plain");
  Subprocess run =
      ranks == 1 ? StartTrain(SameSamplesRun(plain, 6, validating), plain + "/stderr")
                 : LaunchTrain(ranks, SameSamplesRun(plain, 6, validating), plain + "/stderr");
  ASSERT_EQ(run.Wait(), 0) << run.Stderr();
  for (const std::vector<std::string>& recompute : {kUniform, kBlock, kSelective}) {
    SCOPED_TRACE(recompute[1]);
    const std::string dir = NewTempDir("recomputed");
    const std::vector<std::string> args = SameSamplesRun(dir, 6, With(validating, recompute));
    Subprocess recomputed =
        ranks == 1 ? StartTrain(args, dir + "/stderr") : LaunchTrain(ranks, args, dir + "/stderr");
    ASSERT_EQ(recomputed.Wait(), 0) << recomputed.Stderr();
    ExpectSameTrace(Metrics(plain), Metrics(dir));
    EXPECT_LT(PeakTensorMemoryGib(dir), PeakTensorMemoryGib(plain));
  }
}

TEST(TrainRecomputeTest, TheGptTraceIsBitIdentical) { ExpectRecomputationChangesNothing(1, {}); }

TEST(TrainRecomputeTest, TheLlamaTraceIsBitIdentical) {
  ExpectRecomputationChangesNothing(1, PretrainedRun("llama_gqa_untied"));
}

// Megatron's bf16: bf16 layers, float32 main gradients; the rerun rounds as the first run did.
TEST(TrainRecomputeTest, Bf16TracesAreBitIdentical) {
  ExpectRecomputationChangesNothing(1, {"model.bf16=true"});
  ExpectRecomputationChangesNothing(1,
                                    With(PretrainedRun("llama_gqa_untied"), {"model.bf16=true"}));
}

// LoRA: the embedding is frozen, so the layers' input needs no gradient; the adapters still
// get theirs.
TEST(TrainRecomputeTest, UnderLoraTheAdaptersStillLearn) {
  ExpectRecomputationChangesNothing(
      1, With(PretrainedRun("llama_gqa_untied"), {"peft.dim=4", "peft.alpha=8"}));
}

TEST(TrainRecomputeTest, TensorAndPipelineParallelTracesAreBitIdentical) {
  for (const char* layout :
       {"distributed.tensor_model_parallel_size=2", "distributed.pipeline_model_parallel_size=2"}) {
    SCOPED_TRACE(layout);
    ExpectRecomputationChangesNothing(2, With(PretrainedRun("llama_gqa_untied"), {layout}));
  }
}

// The experts' all-to-all runs again in backward on both ranks; the router's load-balancing loss
// gets its gradient once.
TEST(TrainRecomputeTest, AMixtureOfExpertsTraceIsBitIdentical) {
  ExpectRecomputationChangesNothing(
      2, {"model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_aux_loss_coeff=0.01",
          "distributed.expert_model_parallel_size=2"});
}

TEST(TrainRecomputeTest, MegatronsChecksAreNamed) {
  const std::string run_dir = NewTempDir("refused");
  ExpectRefused(1, {"model.recompute_granularity=full"},
                "model.recompute_granularity \"full\" needs model.recompute_method",
                run_dir + "/no_method");
  ExpectRefused(1,
                {"model.recompute_granularity=full", "model.recompute_method=block",
                 "model.recompute_num_layers=3"},
                "model.recompute_num_layers (3) must be between 1 and the layers of a pipeline "
                "stage (2)",
                run_dir + "/too_many");
  ExpectRefused(1, {"model.recompute_granularity=selective", "model.recompute_num_layers=1"},
                "model.recompute_method and model.recompute_num_layers must be unset with "
                "model.recompute_granularity \"selective\"",
                run_dir + "/selective_count");
  ExpectRefused(1, {"model.recompute_granularity=selective", "model.recompute_modules=moe_act"},
                "model.recompute_modules: \"moe_act\" is not a module Keel recomputes; allowed: "
                "core_attn, mlp, layernorm",
                run_dir + "/module");
  ExpectRefused(1, {"model.recompute_method=sometimes"}, "model.recompute_method",
                run_dir + "/method");
}

}  // namespace
}  // namespace keel::tools
