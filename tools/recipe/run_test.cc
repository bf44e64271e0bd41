// The recipe in-process, on a small corpus and model: the loss of a step does not depend on how
// its batch is split into micro-batches, a run ends at max_steps with its checkpoint and
// metrics, a second run resumes where the first stopped, and a preemption request checkpoints
// the step it arrives at and stops.
#include "tools/recipe/run.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduling/preemption.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/corpus.h"
#include "tools/recipe/corpus_testutil.h"
#include "tools/recipe/metrics.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// One layer of width 32 over 16-token windows, 4 samples a step in micro-batches of 2,
// synchronous checkpoints every 2 steps.
TrainOptions SmallOptions(const std::string& run_dir, int64_t max_steps) {
  TrainOptions options;
  options.run_dir = run_dir;
  options.seed = 7;
  options.step_scheduler.global_batch_size = 4;
  options.step_scheduler.max_steps = max_steps;
  options.step_scheduler.ckpt_every_steps = 2;
  options.step_scheduler.val_every_steps = 2;
  options.step_scheduler.preemption_signal = std::nullopt;
  options.local_batch_size = 2;
  options.data.prefix = PangramCorpus();
  options.data.dataset.sequence_length = 16;
  options.data.validation_every_n_samples = 10;
  options.sampler.micro_batch_size = 2;
  options.sampler.global_batch_size = 4;
  options.sampler.dataloader_type = sampling::DataloaderType::kSingle;
  options.model.hidden_size = 32;
  options.model.num_layers = 1;
  options.model.num_attention_heads = 2;
  options.model.ffn_hidden_size = 64;
  options.model.max_sequence_length = 16;
  options.lr_scheduler.max_lr = 1e-3;
  options.lr_scheduler.lr_decay_steps = 100;
  options.checkpoint.checkpoint_dir = run_dir + "/checkpoints";
  options.logging.tensorboard = false;
  return options;
}

TrainRuntime Runtime(std::ostream& log) {
  TrainRuntime runtime;
  runtime.log = &log;
  return runtime;
}

// Gradient accumulation: two micro-batches of one sample each give the step of one
// micro-batch of both samples. The loss is divided by the same label-token count either way;
// the sums differ only in the order of float additions, hence the tolerance.
TEST(RunTest, StepLossDoesNotDependOnTheMicroBatchSplit) {
  std::ostringstream log;
  const std::string dir = keel::testing::NewTempDir("split");
  KEEL_ASSERT_OK_AND_ASSIGN(auto whole, Run::Build(SmallOptions(dir + "/a", 4), Runtime(log)));
  KEEL_ASSERT_OK_AND_ASSIGN(auto split, Run::Build(SmallOptions(dir + "/b", 4), Runtime(log)));
  KEEL_ASSERT_OK_AND_ASSIGN(StepOutput one, whole->Step({{0, 1}}));
  KEEL_ASSERT_OK_AND_ASSIGN(StepOutput two, split->Step({{0}, {1}}));
  EXPECT_EQ(one.label_tokens, 2 * 16);
  EXPECT_EQ(two.label_tokens, one.label_tokens);
  // A fresh model predicts about uniformly over 256 bytes: ln 256 = 5.55 nats.
  EXPECT_NEAR(one.loss, std::log(256.0), 0.2);
  EXPECT_NEAR(two.loss, one.loss, 1e-6 * one.loss);
  EXPECT_NEAR(two.grad_norm, one.grad_norm, 1e-5 * one.grad_norm);
  EXPECT_EQ(two.lr, one.lr);
}

TEST(RunTest, TrainsToMaxStepsThenResumesWhereItStopped) {
  const std::string run_dir = keel::testing::NewTempDir("resume");
  std::ostringstream first_log;
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult first, Train(SmallOptions(run_dir, 3), Runtime(first_log)));
  EXPECT_EQ(first.start_step, 0);
  EXPECT_EQ(first.final_step, 3);
  EXPECT_FALSE(first.preempted);
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::FindResult found,
                            checkpoint::FindLatest(run_dir + "/checkpoints"));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->step, 3);

  std::ostringstream second_log;
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult second,
                            Train(SmallOptions(run_dir, 5), Runtime(second_log)));
  EXPECT_THAT(second_log.str(), HasSubstr("resumed from " + found.latest->path));
  EXPECT_EQ(second.start_step, 3);
  EXPECT_EQ(second.final_step, 5);
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> metrics,
                            ReadJsonl(run_dir + "/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 5u);
  for (size_t i = 0; i < metrics.size(); ++i) EXPECT_EQ(metrics[i].step, int64_t(i) + 1);
  EXPECT_EQ(metrics[3].resumed_from_step, 3);
  // Validation: every 2 steps, and on every checkpoint (every 2 steps and each run's last step).
  EXPECT_FALSE(metrics[0].val_loss.has_value());
  for (size_t i = 1; i < metrics.size(); ++i) EXPECT_TRUE(metrics[i].val_loss.has_value()) << i;
  EXPECT_TRUE(keel::testing::ReadFileOrFail(run_dir + "/loss.svg").find("<svg") == 0);
}

// Throughput is measured over the steps between progress lines: a step without one has none
// (it once read 0.0).
TEST(RunTest, OnlyStepsWithAProgressLineHaveAThroughput) {
  const std::string run_dir = keel::testing::NewTempDir("throughput");
  TrainOptions options = SmallOptions(run_dir, 6);
  options.step_scheduler.val_every_steps = std::nullopt;
  options.step_scheduler.validate_on_checkpoint = false;
  options.logging.log_every_steps = 3;
  std::ostringstream log;
  KEEL_ASSERT_OK(Train(options, Runtime(log)).status());
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> metrics,
                            ReadJsonl(run_dir + "/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 6u);
  for (const StepMetrics& m : metrics) {
    if (m.step % 3 == 0) {
      ASSERT_TRUE(m.tokens_per_second.has_value()) << m.step;
      EXPECT_GT(*m.tokens_per_second, 0) << m.step;
    } else {
      EXPECT_FALSE(m.tokens_per_second.has_value()) << m.step;
    }
  }
}

// optimizer.fused: the run steps with optim::FusedAdamW, trains as the per-parameter AdamW does
// (its kernel rounds differently: the losses agree to float32 rounding, amplified over 6
// steps), and a resume continues its step counts from the checkpoint, bit for bit.
TEST(RunTest, TheFusedAdamWTrainsAndResumesBitIdentically) {
  const std::string dir = keel::testing::NewTempDir("fused");
  auto fused = [&](const std::string& run_dir, int64_t steps) {
    TrainOptions options = SmallOptions(dir + run_dir, steps);
    options.optimizer.fused = true;
    return options;
  };
  std::ostringstream log;
  KEEL_ASSERT_OK(Train(fused("/whole", 6), Runtime(log)).status());
  EXPECT_THAT(log.str(), HasSubstr("AdamW (fused step)"));
  KEEL_ASSERT_OK(Train(fused("/resumed", 3), Runtime(log)).status());
  KEEL_ASSERT_OK(Train(fused("/resumed", 6), Runtime(log)).status());
  KEEL_ASSERT_OK(Train(SmallOptions(dir + "/loop", 6), Runtime(log)).status());
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> whole,
                            ReadJsonl(dir + "/whole/metrics.jsonl"));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> resumed,
                            ReadJsonl(dir + "/resumed/metrics.jsonl"));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> loop, ReadJsonl(dir + "/loop/metrics.jsonl"));
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(resumed.size(), 6u);
  ASSERT_EQ(loop.size(), 6u);
  for (size_t i = 0; i < whole.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", i + 1));
    EXPECT_EQ(resumed[i].loss, whole[i].loss);
    EXPECT_EQ(resumed[i].grad_norm, whole[i].grad_norm);
    EXPECT_NEAR(whole[i].loss, loop[i].loss, 1e-5 * loop[i].loss);
  }
}

// A checkpoint's directory, its manifest and its saved step scheduler name the same step: the
// one a resume continues at (after N optimizer steps, N).
TEST(RunTest, ACheckpointsNameAndItsSavedSchedulerStateAgree) {
  const std::string run_dir = keel::testing::NewTempDir("step_truth");
  std::ostringstream log;
  KEEL_ASSERT_OK(Train(SmallOptions(run_dir, 5), Runtime(log)).status());
  int checked = 0;
  for (const char* name : {"step_0000000002", "step_0000000004", "step_0000000005"}) {
    SCOPED_TRACE(name);
    const std::string path = run_dir + "/checkpoints/" + name;
    KEEL_ASSERT_OK_AND_ASSIGN(auto reader, checkpoint::CheckpointReader::Open(path));
    KEEL_ASSERT_OK_AND_ASSIGN(base::Json saved, reader->ReadValues("step_scheduler"));
    KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::VerifyReport report,
                              checkpoint::Verify(path, checkpoint::VerifyLevel::kStructure));
    const int64_t step = std::stoll(std::string(name).substr(5));
    EXPECT_EQ(saved["step"].get<int64_t>(), step);
    EXPECT_EQ(report.checkpoint.step, step);
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

// Too little data for one global batch is an error naming the data, the counts and the longest
// sequence_length that works, not a crash: with drop_last the sampler draws from whole global
// batches of the split, here none. (At 11 tokens, 200 / 11 = 18 windows, 17 of them for
// training; at 12, 16 windows and 15.)
TEST(RunTest, DataWithoutAGlobalBatchIsAnErrorNamingIt) {
  const std::string dir = keel::testing::NewTempDir("tiny");
  keel::testing::WriteFileOrFail(dir + "/text.txt", std::string(200, 'x'));
  ASSERT_THAT(BuildByteCorpus({dir + "/text.txt"}, dir + "/tiny").status(), IsOk());
  TrainOptions options = SmallOptions(dir + "/run", 4);
  options.data.prefix = dir + "/tiny";  // 201 tokens: 12 windows of 16, 11 for training
  options.step_scheduler.global_batch_size = 16;
  options.sampler.global_batch_size = 16;
  options.sampler.drop_last = true;
  std::ostringstream log;
  EXPECT_THAT(Run::Build(options, Runtime(log)).status(),
              keel::testing::StatusIs(
                  absl::StatusCode::kInvalidArgument,
                  ::testing::AllOf(
                      HasSubstr("data.sequence_length (16) is longer than " + dir +
                                "/tiny allows: its 201 tokens make 11 training window(s) of 16 "
                                "tokens, and a step needs 16 (step_scheduler.global_batch_size"),
                      HasSubstr("sequence lengths up to 11 work"))));
}

// A start that leaves nothing to train is refused before the model is built, rather than a
// run that trains nothing and then fails to plot its empty metrics.
TEST(RunTest, AStartPastTheEndIsAnErrorNamingIt) {
  const std::string dir = keel::testing::NewTempDir("start_past_end");
  TrainOptions options = SmallOptions(dir + "/run", 4);
  options.step_scheduler.start_step = options.step_scheduler.max_steps.value();
  std::ostringstream log;
  EXPECT_THAT(Run::Build(options, Runtime(log)).status(),
              keel::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr(absl::StrCat("step_scheduler.start_step (",
                                                             options.step_scheduler.start_step,
                                                             ") leaves no step to train"))));
}

// Raises its flag once the step scheduler has polled it `after` times.
class PreemptAfterPolls : public scheduling::PreemptionFlag {
 public:
  explicit PreemptAfterPolls(int after) : left_(after) {}
  bool Received() const override { return left_.fetch_sub(1) <= 0; }

 private:
  mutable std::atomic<int> left_;
};

TEST(RunTest, PreemptionCheckpointsTheStepAndStops) {
  const std::string run_dir = keel::testing::NewTempDir("preempt");
  TrainOptions options = SmallOptions(run_dir, 100);
  options.step_scheduler.ckpt_every_steps = 1000;
  std::ostringstream log;
  TrainRuntime runtime = Runtime(log);
  // The scheduler polls once per step (and once per epoch): the 4th poll answers yes.
  runtime.preemption = std::make_unique<PreemptAfterPolls>(3);
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult result, Train(options, std::move(runtime)));
  EXPECT_TRUE(result.preempted);
  EXPECT_LT(result.final_step, 100);
  EXPECT_THAT(log.str(), HasSubstr(absl::StrCat("preempted at step ", result.final_step)));
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::FindResult found,
                            checkpoint::FindLatest(run_dir + "/checkpoints"));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->step, result.final_step);
}

// SIGUSR1 (a real signal, through the real handler) arrives during step 2's validation pass:
// the pass stops after the batch it is on, and the checkpoint is step 2's.
class SignalDuringValidation : public scheduling::PreemptionFlag {
 public:
  explicit SignalDuringValidation(int raise_at_poll)
      : raise_at_(raise_at_poll), signals_(*scheduling::SignalPreemptionFlag::Create({SIGUSR1})) {}
  bool Received() const override {
    if (++polls_ == raise_at_) raise(SIGUSR1);
    return signals_->Received();
  }

 private:
  const int raise_at_;
  mutable int polls_ = 0;
  std::unique_ptr<scheduling::SignalPreemptionFlag> signals_;
};

TEST(RunTest, PreemptionDuringValidationStopsWithinABatch) {
  const std::string run_dir = keel::testing::NewTempDir("validation");
  TrainOptions options = SmallOptions(run_dir, 100);
  options.step_scheduler.ckpt_every_steps = 1000;
  std::ostringstream log;
  TrainRuntime runtime = Runtime(log);
  // Polls: the epoch's start (step 0), step 1's validation flag (a checkpoint step? no), then
  // one after each validation batch of step 2: the 4th poll is right after its second batch.
  runtime.preemption = std::make_unique<SignalDuringValidation>(4);
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult result, Train(options, std::move(runtime)));
  EXPECT_TRUE(result.preempted);
  EXPECT_EQ(result.final_step, 2);
  EXPECT_THAT(log.str(), ::testing::ContainsRegex("validation stopped after 2 of [0-9]+ batches"));
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::FindResult found,
                            checkpoint::FindLatest(run_dir + "/checkpoints"));
  ASSERT_TRUE(found.latest.has_value());
  EXPECT_EQ(found.latest->step, 2);
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> metrics,
                            ReadJsonl(run_dir + "/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_FALSE(metrics[1].val_loss.has_value());  // the pass did not finish
}

// A deliberate change (more steps, another learning rate) continues after a warning listing
// each field with both values; another model is an error naming its fields, and the
// checkpoint stays where it is.
TEST(RunTest, ResumingWithAnotherConfigurationWarnsOrRefuses) {
  const std::string run_dir = keel::testing::NewTempDir("config");
  std::ostringstream first_log;
  KEEL_ASSERT_OK(Train(SmallOptions(run_dir, 3), Runtime(first_log)).status());

  TrainOptions longer = SmallOptions(run_dir, 5);
  longer.lr_scheduler.max_lr = 2e-3;
  std::ostringstream log;
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult result, Train(longer, Runtime(log)));
  EXPECT_EQ(result.final_step, 5);
  EXPECT_THAT(log.str(), HasSubstr("warning: the configuration differs from the checkpoint's: "
                                   "lr_scheduler.max_lr: 0.001 in the checkpoint, 0.002 now"));
  EXPECT_THAT(log.str(), HasSubstr("step_scheduler.max_steps: 3 in the checkpoint, 5 now"));

  TrainOptions wider = SmallOptions(run_dir, 7);
  wider.model.hidden_size = 64;
  std::ostringstream refused_log;
  EXPECT_THAT(Train(wider, Runtime(refused_log)).status(),
              keel::testing::StatusIs(
                  absl::StatusCode::kInvalidArgument,
                  ::testing::AllOf(HasSubstr("holds another model"),
                                   HasSubstr("model.hidden_size: 32 in the checkpoint, 64 now"))));
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::FindResult found,
                            checkpoint::FindLatest(run_dir + "/checkpoints"));
  EXPECT_EQ(found.latest->step, 5);
}

// The newest checkpoint's shard has a flipped bit: the run warns, moves it aside, resumes from
// the one before and ends as the uninterrupted run does. In metrics.jsonl the resumed run's
// first row says where it resumed, so the rows of the abandoned steps 3 and 4 before it can be
// told from theirs.
TEST(RunTest, ACorruptNewestCheckpointIsSetAsideAndTheOneBeforeResumes) {
  const std::string dir = keel::testing::NewTempDir("corrupt");
  std::ostringstream reference_log;
  KEEL_ASSERT_OK(Train(SmallOptions(dir + "/reference", 6), Runtime(reference_log)).status());

  const std::string run_dir = dir + "/run";
  std::ostringstream first_log;
  KEEL_ASSERT_OK(Train(SmallOptions(run_dir, 4), Runtime(first_log)).status());
  const std::string newest = run_dir + "/checkpoints/step_0000000004";
  KEEL_ASSERT_OK_AND_ASSIGN(checkpoint::Manifest manifest, checkpoint::ReadManifest(newest));
  keel::testing::FlipBit(newest + "/" + manifest.files(0).name(),
                         manifest.tensors(0).chunks(0).byte_offset() + 1);
  std::ostringstream log;
  KEEL_ASSERT_OK_AND_ASSIGN(TrainResult result, Train(SmallOptions(run_dir, 6), Runtime(log)));
  EXPECT_THAT(log.str(), HasSubstr("warning: checkpoint " + newest + " does not load ("));
  EXPECT_THAT(log.str(),
              HasSubstr("moved to " + run_dir + "/checkpoints/quarantine/step_0000000004"));
  EXPECT_THAT(log.str(), HasSubstr("resumed from " + run_dir + "/checkpoints/step_0000000002"));
  EXPECT_EQ(result.start_step, 2);
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> expected,
                            ReadJsonl(dir + "/reference/metrics.jsonl"));
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> actual, ReadJsonl(run_dir + "/metrics.jsonl"));
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].loss, expected[i].loss) << "step " << expected[i].step;
    EXPECT_EQ(actual[i].grad_norm, expected[i].grad_norm) << "step " << expected[i].step;
  }
  std::vector<base::Json> rows;
  std::istringstream lines(keel::testing::ReadFileOrFail(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) rows.push_back(base::Json::parse(line));
  ASSERT_EQ(rows.size(), 8u);  // steps 1-4, then 3-6
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["step"], i < 4 ? i + 1 : i - 1) << i;
    if (i == 4) {
      EXPECT_EQ(rows[i]["resumed_from_step"], 2);
    } else {
      EXPECT_TRUE(rows[i]["resumed_from_step"].is_null()) << i;
    }
  }
}

// model.pretrained_path: an export of a run's checkpoint starts a new run with exactly those
// weights (a zero learning rate keeps them through the one step, so the new run's checkpoint
// shows what it started from); resuming that run ignores the path; a model of another shape
// is refused before any step, naming the tensors.
TEST(RunTest, StartsFromHuggingFaceWeightsUnlessItResumes) {
  const std::string dir = keel::testing::NewTempDir("pretrained");
  std::ostringstream first_log;
  KEEL_ASSERT_OK(Train(SmallOptions(dir + "/source", 2), Runtime(first_log)).status());
  checkpoint::HfExportOptions export_options;
  export_options.max_shard_bytes = 4096;  // an index and several shards
  KEEL_ASSERT_OK_AND_ASSIGN(
      checkpoint::HfExportResult exported,
      checkpoint::ExportHfSafetensors(dir + "/source/checkpoints/step_0000000002", dir + "/hf",
                                      export_options));
  ASSERT_GT(exported.files.size(), 2u);

  TrainOptions options = SmallOptions(dir + "/new", 1);
  options.pretrained_path = dir + "/hf";
  options.lr_scheduler.max_lr = 0.0;
  std::ostringstream log;
  KEEL_ASSERT_OK(Train(options, Runtime(log)).status());
  EXPECT_THAT(log.str(), HasSubstr(absl::StrCat("model: ", exported.num_tensors,
                                                " tensors from " + dir + "/hf")));
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto source, checkpoint::CheckpointReader::Open(dir + "/source/checkpoints/step_0000000002"));
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto started, checkpoint::CheckpointReader::Open(dir + "/new/checkpoints/step_0000000001"));
  for (const auto& entry : source->manifest().tensors()) {
    const std::string& key = entry.name();
    if (!absl::StartsWith(key, "model/")) continue;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor expected, source->ReadTensor(key));
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor actual, started->ReadTensor(key));
    EXPECT_TRUE(at::equal(actual, expected)) << key;
  }

  options.step_scheduler.max_steps = 2;
  std::ostringstream resumed_log;
  KEEL_ASSERT_OK(Train(options, Runtime(resumed_log)).status());
  EXPECT_THAT(resumed_log.str(),
              HasSubstr("model: resuming from the run's own checkpoint, not from "
                        "model.pretrained_path (" +
                        dir + "/hf)"));
  EXPECT_THAT(resumed_log.str(), Not(HasSubstr("tensors from")));

  TrainOptions wider = SmallOptions(dir + "/wider", 1);
  wider.pretrained_path = dir + "/hf";
  wider.model.hidden_size = 64;
  std::ostringstream refused_log;
  EXPECT_THAT(Train(wider, Runtime(refused_log)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("model.pretrained_path"),
                             HasSubstr("\"wte.weight\": shape [256, 32] in the files, [256, 64] "
                                       "in the model"))));
  EXPECT_FALSE(std::filesystem::exists(dir + "/wider/checkpoints/step_0000000001"));
}

}  // namespace
}  // namespace keel::tools::recipe
