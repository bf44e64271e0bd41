// //tools:train on conversations (data.format "sft"), as child processes: the first step's loss
// is transformers' answer-only loss on the same conversations (the fixture
// testdata/hf_parity/llama_gqa_untied_sft, recorded by hf_parity.py: labels -100 where not
// learned, shifted per conversation, summed over the conversations and divided by their learned
// tokens, as NeMo AutoModel's MaskedCrossEntropy over num_label_tokens), tensor and pipeline
// parallelism and data parallelism with the distributed optimizer follow the one-rank run, with
// LoRA too; overlong conversations are counted; what the format needs is named. Packed
// conversations (packed_sequence.packed_sequence_size) train as the same conversations
// unpacked, on every layout.
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
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

// A run of the fixture Llama on the conversations at `prefix`: sequence_length 32, no
// validation, in file order.
std::vector<std::string> SftRun(const std::string& prefix, std::vector<std::string> more = {}) {
  std::vector<std::string> args = PretrainedRun("llama_gqa_untied");
  for (const std::string& field :
       {"data.prefix=" + prefix, std::string("data.format=sft"),
        std::string("data.sequence_length=32"), std::string("data.validation_every_n_samples=0"),
        std::string("lr_scheduler.max_lr=1e-2"), std::string("lr_scheduler.min_lr=1e-3")}) {
    args.push_back(field);
  }
  return With(args, more);
}

// The first step over all four conversations of the fixture (two micro-batches of two, padded
// to 32 tokens) computes transformers' answer-only loss.
TEST(TrainSftTest, TheLossIsTransformersAnswerOnlyLoss) {
  const SftFixture fixture = ReadSftFixture();
  const std::string prefix = WriteConversations("fixture", fixture.conversations);
  const std::string run_dir = NewTempDir("fixture_run");
  Subprocess run = StartTrain(SameSamplesRun(run_dir, 1,
                                             SftRun(prefix, {"step_scheduler.global_batch_size=4",
                                                             "step_scheduler.local_batch_size=2"})),
                              run_dir + "/stderr");
  ASSERT_EQ(run.Wait(), 0) << run.Stderr();
  EXPECT_THAT(run.DrainStdout(), HasSubstr("data: 4 training and 0 validation conversations of "));
  const std::vector<recipe::StepMetrics> trace = Metrics(run_dir);
  ASSERT_EQ(trace.size(), 1u);
  EXPECT_NEAR(trace[0].loss, fixture.loss, 1e-5 * fixture.loss);
}

// 80 conversations of 6 to 45 tokens below the fixture's vocabulary, the first third of each
// a prompt that is not learned; those longer than 33 tokens truncated.
std::string SkewedConversations() {
  std::vector<TestConversation> conversations;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
  for (int c = 0; c < 80; ++c) {
    const int64_t n = 6 + at::randint(40, {1}, generator, at::kLong).item<int64_t>();
    const at::Tensor ids = at::randint(131, {n}, generator, at::kLong);
    std::vector<int64_t> mask(n, 1);
    for (int64_t j = 0; j < n / 3; ++j) mask[j] = 0;
    conversations.push_back({{ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n}, mask});
  }
  return WriteConversations("skewed", conversations);
}

// Every layout computes the one-rank run's trace on conversations, with LoRA too.
TEST(TrainSftTest, LayoutsComputeTheOneRankRun) {
  const std::string prefix = SkewedConversations();
  for (const std::vector<std::string>& lora :
       std::vector<std::vector<std::string>>{{}, {"peft.dim=4", "peft.alpha=8"}}) {
    SCOPED_TRACE(lora.empty() ? "full" : "lora");
    const std::vector<std::string> common = SftRun(
        prefix, With({"data.overlong=truncate", "data.validation_every_n_samples=10"}, lora));
    const std::string reference = NewTempDir("sft_reference");
    Subprocess one = StartTrain(SameSamplesRun(reference, 8, common), reference + "/stderr");
    ASSERT_EQ(one.Wait(), 0) << one.Stderr();
    EXPECT_THAT(one.DrainStdout(),
                HasSubstr("data: 72 training and 8 validation conversations of "));
    for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
             {"distributed.tensor_model_parallel_size=2", "step_scheduler.local_batch_size=8"},
             {"distributed.pipeline_model_parallel_size=2"},
             {"distributed.use_distributed_optimizer=true"}}) {
      SCOPED_TRACE(layout[0]);
      const std::string run_dir = NewTempDir("sft_layout");
      Subprocess ranks =
          LaunchTrain(2, SameSamplesRun(run_dir, 8, With(common, layout)), run_dir + "/stderr");
      ASSERT_EQ(ranks.Wait(), 0) << ranks.Stderr();
      ExpectLayoutInvariant(reference, run_dir);
    }
  }
}

// 24 conversations predicting 17, 12 and 9 tokens in turn (18, 13 and 10 tokens, the first
// third of each a prompt): in packs of 40, three to a pack (17 + 12 + 9 = 38, and the next 17
// does not fit), 8 packs.
std::string PackableConversations() {
  std::vector<TestConversation> conversations;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/5);
  for (int c = 0; c < 24; ++c) {
    const int64_t n = std::vector<int64_t>{18, 13, 10}[c % 3];
    const at::Tensor ids = at::randint(131, {n}, generator, at::kLong);
    std::vector<int64_t> mask(n, 1);
    for (int64_t j = 0; j < n / 3; ++j) mask[j] = 0;
    conversations.push_back({{ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n}, mask});
  }
  return WriteConversations("packable", conversations);
}

// Each step takes all 24 conversations, one per row padded to 32 tokens or three per row of 40
// packed: the packed steps' losses and gradient norms are the unpacked ones (NeMo-RL #2105
// trained for weeks with attention crossing packed conversations: here the first loss alone
// would move).
TEST(TrainSftTest, PackedStepsAreTheUnpackedSteps) {
  const std::string prefix = PackableConversations();
  const std::string unpacked = NewTempDir("unpacked");
  Subprocess one = StartTrain(SameSamplesRun(unpacked, 3,
                                             SftRun(prefix, {"step_scheduler.global_batch_size=24",
                                                             "step_scheduler.local_batch_size=4"})),
                              unpacked + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();
  const std::string packed = NewTempDir("packed");
  Subprocess run =
      StartTrain(SameSamplesRun(packed, 3,
                                SftRun(prefix, {"packed_sequence.packed_sequence_size=40",
                                                "step_scheduler.global_batch_size=8",
                                                "step_scheduler.local_batch_size=2"})),
                 packed + "/stderr");
  ASSERT_EQ(run.Wait(), 0) << run.Stderr();
  EXPECT_THAT(run.DrainStdout(),
              HasSubstr("data: 24 training and 0 validation conversations of " + prefix +
                        ", packed into 8 and 0 sequences of 40 tokens"));
  ExpectLayoutInvariant(unpacked, packed, {1e-6, 1e-5, 1e-4});
}

// Packed conversations through tensor and pipeline parallelism (the sequence lengths travel
// with each micro-batch to every stage), with validation, follow the one-rank packed run.
TEST(TrainSftTest, PackedLayoutsComputeTheOneRankRun) {
  const std::vector<std::string> common =
      SftRun(SkewedConversations(), {"data.overlong=truncate", "data.validation_every_n_samples=10",
                                     "packed_sequence.packed_sequence_size=64"});
  const std::string reference = NewTempDir("packed_reference");
  Subprocess one = StartTrain(SameSamplesRun(reference, 8, common), reference + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();
  EXPECT_THAT(one.DrainStdout(), HasSubstr("training and 8 validation conversations of "));
  for (const std::vector<std::string>& layout : std::vector<std::vector<std::string>>{
           {"distributed.tensor_model_parallel_size=2", "step_scheduler.local_batch_size=8"},
           {"distributed.pipeline_model_parallel_size=2"}}) {
    SCOPED_TRACE(layout[0]);
    const std::string run_dir = NewTempDir("packed_layout");
    Subprocess ranks =
        LaunchTrain(2, SameSamplesRun(run_dir, 8, With(common, layout)), run_dir + "/stderr");
    ASSERT_EQ(ranks.Wait(), 0) << ranks.Stderr();
    ExpectLayoutInvariant(reference, run_dir);
  }
}

TEST(TrainSftTest, WhatTheFormatNeedsIsNamed) {
  const std::string run_dir = NewTempDir("refused");
  ExpectRefused(1, {"data.format=sft"},
                "data.format \"sft\" trains on the conversations at data.prefix (unset)",
                run_dir + "/no_prefix");
  // A token stream without a loss mask beside it.
  ExpectRefused(1, SftRun(HfFixtureTokens()),
                "tokens_loss_mask.bin/.idx): data.format \"sft\" trains on conversations that "
                "tools/scripts/hf_sft_tokenize.py writes",
                run_dir + "/no_mask");
  ExpectRefused(1, SftRun(SkewedConversations(), {"data.overlong=cut"}), "data.overlong",
                run_dir + "/overlong");
  // Dropped conversations are counted.
  const std::string dropped = NewTempDir("dropped");
  Subprocess run =
      StartTrain(SameSamplesRun(dropped, 1, SftRun(SkewedConversations())), dropped + "/stderr");
  ASSERT_EQ(run.Wait(), 0) << run.Stderr();
  EXPECT_THAT(run.DrainStdout(), HasSubstr(" longer than data.sequence_length + 1 (33) tokens "
                                           "dropped (data.overlong)"));
  // Packing: only conversations, and what fits no pack is counted.
  ExpectRefused(1, {"packed_sequence.packed_sequence_size=64"},
                "packed_sequence.packed_sequence_size (64) packs conversations; allowed with "
                "data.format \"sft\", else 0",
                run_dir + "/packing_windows");
  ExpectRefused(1, SftRun(SkewedConversations(), {"packed_sequence.packed_sequence_size=-1"}),
                "packed_sequence.packed_sequence_size (-1) must be >= 0", run_dir + "/negative");
  const std::string unpackable = NewTempDir("unpackable");
  Subprocess packed = StartTrain(
      SameSamplesRun(unpackable, 1,
                     SftRun(SkewedConversations(),
                            {"data.overlong=truncate", "packed_sequence.packed_sequence_size=20"})),
      unpackable + "/stderr");
  ASSERT_EQ(packed.Wait(), 0) << packed.Stderr();
  EXPECT_THAT(packed.DrainStdout(), HasSubstr(" predicting more than 20 tokens dropped (they fit "
                                              "no pack)"));
}

}  // namespace
}  // namespace keel::tools
