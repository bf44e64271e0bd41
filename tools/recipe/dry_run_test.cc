#include "tools/recipe/dry_run.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/fixed_window_dataset.h"
#include "sampling/indexed_dataset.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/corpus.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {
namespace {

using ::absl::StatusCode;
using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(CompressStepsTest, RunsOfThreeOrMoreBecomeRanges) {
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
      {{}, "none"},
      {{7}, "7"},
      {{4, 8}, "4, 8"},
      {{1, 2, 3}, "1-3"},
      {{1, 2, 3, 5, 50, 100, 150, 200}, "1-3, 5, 50-200 every 50"},
      {{100, 200, 300, 310, 400}, "100-300 every 100, 310, 400"},
      {{5, 10, 15, 20, 23}, "5-20 every 5, 23"},
  };
  for (const auto& [steps, expected] : cases) EXPECT_EQ(CompressSteps(steps), expected);
}

// A byte corpus of a few thousand tokens.
std::string CorpusPrefix(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 150; ++i) absl::StrAppend(&text, "Line ", i, ": the quick brown fox.\n\n");
  keel::testing::WriteFileOrFail(dir + "/text.txt", text);
  EXPECT_THAT(BuildByteCorpus({dir + "/text.txt"}, dir + "/corpus").status(), IsOk());
  return dir + "/corpus";
}

// 4 samples a step in micro-batches of 2 on one rank; one epoch; warm-up to 1.0 over 10 steps.
TrainOptions SmallOptions(const std::string& dir) {
  TrainOptions options;
  options.run_dir = dir + "/run";
  options.step_scheduler.global_batch_size = 4;
  options.step_scheduler.num_epochs = 1;
  options.step_scheduler.max_steps = 1000;
  options.step_scheduler.ckpt_every_steps = 5;
  options.step_scheduler.val_every_steps = 3;
  options.step_scheduler.validate_on_checkpoint = false;
  options.step_scheduler.save_checkpoint_every_epoch = false;
  options.local_batch_size = 2;
  options.data.prefix = CorpusPrefix(dir);
  options.data.dataset.sequence_length = 16;
  options.data.validation_every_n_samples = 10;
  options.sampler.micro_batch_size = 2;
  options.sampler.global_batch_size = 4;
  options.lr_scheduler.max_lr = 1.0;
  options.lr_scheduler.min_lr = 0.1;
  options.lr_scheduler.lr_warmup_steps = 10;
  options.lr_scheduler.lr_decay_steps = 100;
  options.lr_scheduler.lr_decay_style = optim::LrDecayStyle::kLinear;
  options.lr_scheduler.start_wd = 0.01;
  options.lr_scheduler.end_wd = 0.01;
  return options;
}

// Every step's number s with s % every == 0, and the last.
std::vector<int64_t> Every(int64_t every, int64_t last, bool and_last) {
  std::vector<int64_t> steps;
  for (int64_t s = every; s <= last; s += every) steps.push_back(s);
  if (and_last && (steps.empty() || steps.back() != last)) steps.push_back(last);
  return steps;
}

TEST(DryRunTest, PrintsTheScheduleTheStepSchedulerGives) {
  const std::string dir = keel::testing::NewTempDir("dry_run");
  const TrainOptions options = SmallOptions(dir);
  // One epoch of the training windows (every 10th validates) cut to whole global batches:
  // NeMo checkpoints after steps 5, 10, ... and the last, validates after 3, 6, ...
  KEEL_ASSERT_OK_AND_ASSIGN(auto tokens, sampling::IndexedDataset::Open(options.data.prefix));
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto windows, sampling::FixedWindowDataset::Create(std::move(tokens), options.data.dataset));
  const int64_t train = windows.size() - windows.size() / 10;
  const int64_t steps = train / 4;
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  const std::string text = out.str();
  EXPECT_THAT(text,
              HasSubstr(absl::StrCat(train, " training windows (", steps * 4, " sampled) and ",
                                     windows.size() / 10, " validation windows of 16")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("steps: ", steps, " over 1 epoch(s) of ", steps,
                                           " steps (max_steps 1000, num_epochs 1)")));
  EXPECT_THAT(text, HasSubstr("each step: 4 samples, 64 tokens; 2 micro-batch(es) of 2 per "
                              "rank on 1 rank(s)"));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("in total: ", steps * 4, " samples, ", steps * 64, " tokens")));
  EXPECT_THAT(text, HasSubstr("checkpoint steps: " + CompressSteps(Every(5, steps, true))));
  EXPECT_THAT(text, HasSubstr("validation steps: " + CompressSteps(Every(3, steps, false))));
  EXPECT_THAT(text, HasSubstr("gc steps: none"));
  // Step s trains at the schedule's step s - 1: warm-up reaches max_lr at step 11.
  EXPECT_THAT(text, HasSubstr("step 1 (first): lr 0, wd 0.01"));
  EXPECT_THAT(text, HasSubstr("step 11 (warm-up end): lr 1, wd 0.01"));
  EXPECT_THAT(text, HasSubstr("step 5 (checkpoint): lr 0.4,"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("step ", steps, " (checkpoint, last): lr ")));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("(", steps / 5 + 1 - 10, " more checkpoint steps not listed)")));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("warning: num_epochs (1) stops the run at step ", steps,
                                           " (", steps,
                                           " steps per epoch), before max_steps "
                                           "(1000); set step_scheduler.num_epochs to at least ",
                                           (1000 + steps - 1) / steps)));
  EXPECT_TRUE(base::PathExists(options.run_dir + "/schedule.svg"));
  EXPECT_FALSE(base::PathExists(options.run_dir + "/checkpoints"));
}

// The schedule's step counts that the configuration left unset follow the run's length (the
// epoch here, fewer than max_steps), and a peak of 0 is a warning.
TEST(DryRunTest, DerivesUnsetStepCountsFromTheRunAndWarnsOfAZeroPeak) {
  const std::string dir = keel::testing::NewTempDir("dry_run_derived");
  TrainOptions options = SmallOptions(dir);
  options.derived_lr_steps = {.lr_warmup_steps = true, .lr_decay_steps = true};
  KEEL_ASSERT_OK_AND_ASSIGN(auto tokens, sampling::IndexedDataset::Open(options.data.prefix));
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto windows, sampling::FixedWindowDataset::Create(std::move(tokens), options.data.dataset));
  const int64_t steps = (windows.size() - windows.size() / 10) / 4;  // one epoch, as above
  ASSERT_GE(steps, 20);
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  // Warm-up over a tenth of the epoch's steps: the peak at the step after.
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("steps: ", steps, " over 1 epoch(s)")));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat("step ", steps / 10 + 1, " (warm-up end): lr 1,")));
  EXPECT_THAT(out.str(), Not(HasSubstr("learning rate is 0")));
  options.lr_scheduler.max_lr = options.lr_scheduler.min_lr = 0;
  out.str("");
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  EXPECT_THAT(out.str(), HasSubstr("warning: the peak learning rate is 0"));
}

// peft: the linear layers that would get adapters, folded over the layers, and the parameters
// that would train: per layer dim x (in + out) of q [32 -> 32], k and v [32 -> 16], o [32 ->
// 32], gate and up [32 -> 64], down [64 -> 32], with dim 8: 512 + 384 + 384 + 512 + 3 x 768.
TEST(DryRunTest, ShowsTheAdaptedLayersAndWhatTrains) {
  const std::string dir = keel::testing::NewTempDir("dry_run_peft");
  TrainOptions options = SmallOptions(dir);
  options.model.family = models::ModelFamily::kLlama;
  options.model.hidden_size = 32;
  options.model.num_layers = 2;
  options.model.num_attention_heads = 4;
  options.model.num_query_groups = 2;
  options.model.ffn_hidden_size = 64;
  options.peft.emplace();
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  EXPECT_THAT(out.str(),
              HasSubstr("peft: LoRA of rank 8, alpha 32 (scale 4), dropout 0 (post), A xavier, "
                        "on 14 linear layers (N: a layer's index):\n"
                        "  model.layers.N.self_attn.q_proj x2\n"
                        "  model.layers.N.self_attn.k_proj x2\n"));
  EXPECT_THAT(out.str(), HasSubstr("  model.layers.N.mlp.down_proj x2\n"));
  // Frozen: the tied embedding once (256 x 32), and per layer two norms (2 x 32), q, k, v, o
  // (32 x 32 + 2 x 16 x 32 + 32 x 32) and the MLP (3 x 64 x 32); the final norm (32).
  EXPECT_THAT(out.str(),
              HasSubstr(absl::StrCat(
                  "peft: trainable 8192 adapter parameters (0.1 MiB with their gradients and AdamW "
                  "state, over all ranks); frozen ",
                  256 * 32 + 2 * (64 + 1024 + 1024 + 1024 + 6144) + 32, " model parameters")));
  options.peft->target_modules = {"*.qkv"};
  EXPECT_THAT(DryRun(options, 1, out),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("peft.target_modules pattern \"*.qkv\" matches none")));
}

// With data.paths the plan names each dataset's weight, samples drawn and epochs per split,
// and builds no index.
TEST(DryRunTest, ShowsEachMegatronDatasetsWeightSamplesAndEpochs) {
  const std::string dir = keel::testing::NewTempDir("dry_run_blend");
  TrainOptions options = SmallOptions(dir);
  const std::string a = CorpusPrefix(dir);
  options.data.prefix.clear();
  options.data.validation_every_n_samples = 0;
  options.data.megatron.paths = absl::StrCat("1 ", a, " 3 ", a);
  options.data.megatron.index_mapping_dir = dir + "/index_cache";
  options.step_scheduler.max_steps = 50;
  options.step_scheduler.val_every_steps = 10;
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  // 50 steps x 4 = 200 samples at 0.25 / 0.75: ceil(200 * 0.25) = 50 and 150; validation
  // (50 / 10) x 4 = 20, split 5 and 15.
  EXPECT_THAT(out.str(), HasSubstr("train: 200 samples (blend)"));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat(a, ": weight 0.25, 50 samples drawn, ")));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat(a, ": weight 0.75, 150 samples drawn, ")));
  EXPECT_THAT(out.str(), HasSubstr("validation: 20 samples (blend)"));
  EXPECT_THAT(out.str(), HasSubstr(absl::StrCat(a, ": weight 0.25, 5 samples drawn, ")));
  EXPECT_THAT(out.str(), HasSubstr(" epoch(s) of documents [0, "));
  EXPECT_THAT(out.str(), HasSubstr("in total: 200 samples"));
  EXPECT_FALSE(base::PathExists(dir + "/index_cache"));
}

TEST(DryRunTest, WarnsAboutCadencesThatNeverFire) {
  const std::string dir = keel::testing::NewTempDir("dry_run_cadence");
  TrainOptions options = SmallOptions(dir);
  options.step_scheduler.max_steps = 4;
  options.step_scheduler.ckpt_every_steps = 100;
  options.step_scheduler.val_every_steps = 50;
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  EXPECT_THAT(out.str(), HasSubstr("warning: step_scheduler.ckpt_every_steps (100) never fires "
                                   "in 4 steps: checkpoints come only from epoch ends and the "
                                   "last step"));
  EXPECT_THAT(out.str(), HasSubstr("warning: step_scheduler.val_every_steps (50) never fires in "
                                   "4 steps"));
  EXPECT_THAT(out.str(), HasSubstr("checkpoint steps: 4\n"));
  EXPECT_THAT(out.str(), Not(HasSubstr("num_epochs (1) stops")));
}

TEST(DryRunTest, CountsTheDefaultCorpusWithoutPreparingItInTheRunDirectory) {
  const std::string dir = keel::testing::NewTempDir("dry_run_default");
  TrainOptions options = SmallOptions(dir);
  options.data.prefix.clear();
  options.data.validation_every_n_samples = 0;
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 1, out));
  EXPECT_THAT(out.str(), HasSubstr("data: the default corpus (counted in a temporary copy; the "
                                   "run prepares it in " +
                                   options.run_dir + "/data/corpus)"));
  EXPECT_THAT(out.str(), HasSubstr("warning: validation never runs: no validation windows "
                                   "(data.validation_every_n_samples 0)"));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> entries, base::ListDirectory(options.run_dir));
  EXPECT_EQ(entries, std::vector<std::string>{"schedule.svg"});
}

// The layout as Megatron's initialize_model_parallel would build it on 4 ranks with pp = 2:
// each kind's groups of more than one rank, and the schedule over the 2 data-parallel ranks
// (2 micro-batches, as many as the stages).
TEST(DryRunTest, PrintsTheLayoutAndSchedulesOverTheDataParallelRanks) {
  const std::string dir = keel::testing::NewTempDir("dry_run_layout");
  TrainOptions options = SmallOptions(dir);
  options.distributed.parallel.pipeline_model_parallel_size = 2;
  options.step_scheduler.global_batch_size = options.sampler.global_batch_size = 8;
  std::ostringstream out;
  KEEL_ASSERT_OK(DryRun(options, 4, out));
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("layout: 4 rank(s), order tp-cp-ep-dp-pp: tp 1, pp 2, cp 1, dp 2; "
                              "ep 1, expert tp 1, expert dp 2\n"));
  EXPECT_THAT(text, HasSubstr("  dp groups: [0, 1] [2, 3]\n"));
  EXPECT_THAT(text, HasSubstr("  pp groups: [0, 2] [1, 3]\n"));
  EXPECT_THAT(text, HasSubstr("  embedding groups: [0, 2] [1, 3]\n"));
  EXPECT_THAT(text, Not(HasSubstr("  tp groups")));
  EXPECT_THAT(text, HasSubstr("2 micro-batch(es) of 2 per rank on 2 rank(s)"));
}

TEST(DryRunTest, RefusesAGeometryThatCannotWork) {
  const std::string dir = keel::testing::NewTempDir("dry_run_geometry");
  std::ostringstream out;
  EXPECT_THAT(DryRun(SmallOptions(dir), 3, out),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("global_batch_size")));
}

// A dataset that records its tokenizer's vocabulary (tools:preprocess --tokenizer_model) needs
// a model that covers it; a corrupt record is named.
TEST(DryRunTest, RefusesAModelSmallerThanTheRecordedVocabulary) {
  const std::string dir = keel::testing::NewTempDir("dry_run_vocab");
  TrainOptions options = SmallOptions(dir);
  KEEL_ASSERT_OK(WriteTokenizerInfo(options.data.prefix,
                                    {"/m/spm.model", 300, 2, true, TokenizerType::kSentencePiece}));
  std::ostringstream out;
  EXPECT_THAT(DryRun(options, 1, out),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("model.vocab_size (256) is smaller than the vocabulary of " +
                                 options.data.prefix + " (300 ids of /m/spm.model, recorded in " +
                                 options.data.prefix +
                                 ".tokenizer.json): set model.vocab_size to at least 300")));
  options.model.vocab_size = 300;
  KEEL_EXPECT_OK(DryRun(options, 1, out));
  keel::testing::WriteFileOrFail(options.data.prefix + ".tokenizer.json", "{\"vocab_size\": 1}");
  EXPECT_THAT(
      DryRun(options, 1, out),
      StatusIs(StatusCode::kDataLoss, HasSubstr(".tokenizer.json: not a tokenizer record")));
}

}  // namespace
}  // namespace keel::tools::recipe
