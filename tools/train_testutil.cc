#include "tools/train_testutil.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <utility>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

ABSL_FLAG(std::string, train, "", "Path of the //tools:train binary.");
ABSL_FLAG(std::string, launch, "", "Path of the //tools:launch binary.");
ABSL_FLAG(std::string, torchrun, "", "Path of @libtorch//:torchrun.");
ABSL_FLAG(std::string, preprocess, "", "Path of the //tools:preprocess binary.");
ABSL_FLAG(std::string, config, "", "Path of tools/recipe/default.textproto.");

namespace keel::tools {

using ::keel::tools::cli::Subprocess;
using ::keel::tools::cli::SubprocessOptions;
using ::keel::tools::recipe::StepMetrics;

std::string Absolute(const std::string& path) { return std::filesystem::absolute(path).string(); }

std::vector<std::string> SmallRun(const std::string& run_dir, int64_t max_steps,
                                  const std::vector<std::string>& more) {
  std::vector<std::string> assignments = {absl::StrCat("run_dir=", run_dir),
                                          absl::StrCat("step_scheduler.max_steps=", max_steps),
                                          "step_scheduler.global_batch_size=8",
                                          "step_scheduler.local_batch_size=4",
                                          "step_scheduler.ckpt_every_steps=3",
                                          "step_scheduler.val_every_steps=8",
                                          "data.sequence_length=64",
                                          "model.num_layers=2",
                                          "model.hidden_size=64",
                                          "model.ffn_hidden_size=256",
                                          "lr_scheduler.lr_warmup_steps=4",
                                          "clip_grad.check_norm_every_steps=1",
                                          "logging.log_every_steps=1"};
  assignments.insert(assignments.end(), more.begin(), more.end());
  std::vector<std::string> args = {"--config=" + Absolute(absl::GetFlag(FLAGS_config))};
  for (const std::string& assignment : assignments) {
    args.push_back("--set");
    args.push_back(assignment);
  }
  return args;
}

SubprocessOptions ChildOptions(const std::string& stderr_path,
                               std::vector<std::string> environment) {
  SubprocessOptions options;
  options.remove_environment = {
      "BUILD_WORKING_DIRECTORY", "OMP_NUM_THREADS", "RANK",       "WORLD_SIZE", "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",        "MASTER_ADDR",     "MASTER_PORT"};
  options.add_environment = {"OMP_NUM_THREADS=1"};
  options.add_environment.insert(options.add_environment.end(), environment.begin(),
                                 environment.end());
  options.stderr_path = stderr_path;
  options.pipe_stdout = true;
  return options;
}

Subprocess StartTrain(const std::vector<std::string>& args, const std::string& stderr_path,
                      std::vector<std::string> environment) {
  std::vector<std::string> argv = {Absolute(absl::GetFlag(FLAGS_train))};
  argv.insert(argv.end(), args.begin(), args.end());
  return Subprocess::Start(argv, ChildOptions(stderr_path, std::move(environment)));
}

std::vector<std::string> SameSamplesRun(const std::string& run_dir, int64_t max_steps,
                                        std::vector<std::string> more) {
  more.insert(more.begin(), "sampler.shuffle_scope=global");
  return SmallRun(run_dir, max_steps, more);
}

std::string HfFixtureTokens() {
  static const std::string* const prefix = [] {
    auto* data = new std::string(testing::NewTempDir("hf_tokens") + "/tokens");
    absl::StatusOr<sampling::IndexedDatasetWriter> writer =
        sampling::IndexedDatasetWriter::Create(*data, sampling::TokenDtype::kUint16);
    EXPECT_TRUE(writer.ok()) << writer.status();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/7);
    for (int document = 0; document < 40 && writer.ok(); ++document) {
      const at::Tensor tokens = at::randint(131, {300}, generator, at::kLong);
      std::vector<int64_t> values(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + 300);
      EXPECT_TRUE(writer->AddDocument(values, {300}).ok());
    }
    if (writer.ok()) {
      EXPECT_TRUE(writer->Finalize().ok());
    }
    return data;
  }();
  return *prefix;
}

std::vector<std::string> PretrainedRun(const std::string& name) {
  return {
      "model.pretrained_path=" + std::filesystem::absolute("testdata/hf_parity/" + name).string(),
      "data.prefix=" + HfFixtureTokens(), "data.sequence_length=16",
      // SmallRun's sizes are the file's but for the MLP: set to the file's, no contradiction.
      "model.ffn_hidden_size=96"};
}

Subprocess StartOnRanks(int ranks, const std::vector<std::string>& args,
                        const std::string& stderr_path) {
  return ranks == 1 ? StartTrain(args, stderr_path) : LaunchTrain(ranks, args, stderr_path);
}

void ExpectRefused(int ranks, const std::vector<std::string>& assignments,
                   const std::string& message, const std::string& run_dir) {
  Subprocess child =
      StartOnRanks(ranks, SameSamplesRun(run_dir, 4, assignments), run_dir + ".stderr");
  EXPECT_EQ(child.Wait(), 2) << child.Stderr();
  EXPECT_THAT(child.Stderr(), ::testing::HasSubstr(message));
}

void ExpectLayoutInvariant(const std::string& reference, const std::string& run_dir,
                           const TraceBounds& bounds) {
  const std::vector<StepMetrics> expected = Metrics(reference);
  const std::vector<StepMetrics> actual = Metrics(run_dir);
  ASSERT_FALSE(expected.empty());
  ASSERT_FALSE(actual.empty());
  EXPECT_NEAR(actual[0].loss, expected[0].loss, bounds.first_loss * expected[0].loss);
  ExpectCloseTrace(expected, actual, bounds.loss, bounds.grad_norm);
}

std::string ExpectResumesAcrossLayouts(
    const std::string& name, const std::vector<Leg>& legs, int64_t steps_per_leg,
    const std::function<void(size_t, const std::string&)>& after_leg,
    const std::vector<std::string>& common) {
  const int64_t steps = steps_per_leg * static_cast<int64_t>(legs.size());
  const std::string reference = keel::testing::NewTempDir(name + "_reference");
  Subprocess one = StartTrain(SameSamplesRun(reference, steps, common), reference + "/stderr");
  EXPECT_EQ(one.Wait(), 0) << one.Stderr();

  const std::string run_dir = keel::testing::NewTempDir(name);
  for (size_t i = 0; i < legs.size(); ++i) {
    const int64_t end = steps_per_leg * static_cast<int64_t>(i + 1);
    SCOPED_TRACE(absl::StrCat("leg ", i, ": ", legs[i].ranks, " rank(s) to step ", end));
    std::vector<std::string> assignments = common;
    assignments.insert(assignments.end(), legs[i].assignments.begin(), legs[i].assignments.end());
    Subprocess child = StartOnRanks(legs[i].ranks, SameSamplesRun(run_dir, end, assignments),
                                    absl::StrCat(run_dir, "/stderr.", i));
    EXPECT_EQ(child.Wait(), 0) << child.Stderr();
    const std::string out = child.DrainStdout();
    if (i > 0) {
      EXPECT_THAT(out,
                  ::testing::HasSubstr(absl::StrFormat("resumed from %s/checkpoints/step_%010d",
                                                       run_dir, end - steps_per_leg)));
    }
    EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("warning: checkpoint")));
    after_leg(i, run_dir);
  }
  EXPECT_EQ(Metrics(reference).size(), static_cast<size_t>(steps));
  ExpectCloseTrace(Metrics(reference), Metrics(run_dir), 1e-4, 1e-3);
  return reference;
}

void ExpectKillNineResumesBitIdentically(
    const std::string& name, int ranks, int64_t steps,
    const std::function<std::vector<std::string>(const std::string&)>& args) {
  const std::string reference = keel::testing::NewTempDir(name + "_reference");
  Subprocess uninterrupted = LaunchTrain(ranks, args(reference), reference + "/stderr");
  ASSERT_EQ(uninterrupted.Wait(), 0) << uninterrupted.Stderr();

  const std::string run_dir = keel::testing::NewTempDir(name);
  int run = 0;
  for (const int64_t kill_after : {7, 12}) {
    SCOPED_TRACE(absl::StrCat("killed after step ", kill_after));
    Subprocess child = LaunchTrain(ranks, args(run_dir), absl::StrCat(run_dir, "/stderr.", ++run));
    ASSERT_TRUE(ReadUntilStep(child, kill_after)) << child.Stderr();
    child.KillGroup(SIGKILL);
    EXPECT_EQ(child.Wait(), 128 + SIGKILL);
    LatestCheckpoint(run_dir);  // what the next run loads verifies
  }
  Subprocess last = LaunchTrain(ranks, args(run_dir), absl::StrCat(run_dir, "/stderr.", ++run));
  ASSERT_EQ(last.Wait(), 0) << last.Stderr();
  EXPECT_THAT(last.DrainStdout(), ::testing::HasSubstr("resumed from "));
  ASSERT_EQ(Metrics(reference).size(), static_cast<size_t>(steps));
  ExpectSameTrace(Metrics(reference), Metrics(run_dir));
  ExpectSameWeights(LatestCheckpoint(reference), LatestCheckpoint(run_dir));
}

Subprocess LaunchTrain(int ranks, const std::vector<std::string>& args,
                       const std::string& stderr_path,
                       const std::vector<std::string>& launch_flags) {
  std::vector<std::string> argv = {Absolute(absl::GetFlag(FLAGS_launch)),
                                   absl::StrCat("--nproc_per_node=", ranks), "--master_port=0"};
  argv.insert(argv.end(), launch_flags.begin(), launch_flags.end());
  argv.push_back("--");
  argv.push_back(Absolute(absl::GetFlag(FLAGS_train)));
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options = ChildOptions(stderr_path);
  options.new_process_group = true;
  return Subprocess::Start(argv, options);
}

std::optional<std::string> WhyNoTorchrun() {
  return keel::testing::WhyNotExecutable(Absolute(absl::GetFlag(FLAGS_torchrun)));
}

Subprocess TorchrunTrain(int ranks, const std::vector<std::string>& args,
                         const std::string& stderr_path) {
  std::vector<std::string> argv = {Absolute(absl::GetFlag(FLAGS_torchrun)), "--no-python",
                                   absl::StrCat("--nproc_per_node=", ranks),
                                   absl::StrCat("--master_port=", keel::testing::FreeTcpPort()),
                                   Absolute(absl::GetFlag(FLAGS_train))};
  argv.insert(argv.end(), args.begin(), args.end());
  return Subprocess::Start(argv, ChildOptions(stderr_path));
}

std::optional<int64_t> ProgressStep(const std::string& line) {
  if (!absl::StartsWith(line, "step ")) return std::nullopt;
  const std::vector<std::string> parts = absl::StrSplit(line.substr(5), '/');
  int64_t step = 0;
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &step)) return std::nullopt;
  return step;
}

bool ReadUntilStep(Subprocess& child, int64_t step) {
  while (std::optional<std::string> line = child.ReadLine()) {
    if (ProgressStep(*line) == step) return true;
  }
  return false;
}

std::optional<int64_t> NumberAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  size_t end = at + prefix.size();
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  int64_t value = 0;
  if (!absl::SimpleAtoi(text.substr(at + prefix.size(), end - at - prefix.size()), &value)) {
    return std::nullopt;
  }
  return value;
}

std::vector<StepMetrics> Metrics(const std::string& run_dir) {
  absl::StatusOr<std::vector<StepMetrics>> metrics = recipe::ReadJsonl(run_dir + "/metrics.jsonl");
  EXPECT_THAT(metrics.status(), keel::testing::IsOk());
  return metrics.ok() ? *std::move(metrics) : std::vector<StepMetrics>();
}

double PeakTensorMemoryGib(const std::string& run_dir) {
  double peak = 0;
  for (const StepMetrics& m : Metrics(run_dir)) {
    peak = std::max(peak, m.max_memory_allocated_gib.value_or(0.0));
  }
  EXPECT_GT(peak, 0) << run_dir << ": no step reported max_memory_allocated_gib";
  return peak;
}

std::string LatestCheckpoint(const std::string& run_dir) {
  absl::StatusOr<checkpoint::FindResult> found =
      checkpoint::FindLatest(run_dir + "/checkpoints", checkpoint::VerifyLevel::kChecksums);
  EXPECT_THAT(found.status(), keel::testing::IsOk());
  if (!found.ok()) return "";
  EXPECT_THAT(found->warnings, ::testing::IsEmpty());
  EXPECT_TRUE(found->latest.has_value()) << "no checkpoint in " << run_dir;
  return found->latest ? found->latest->path : "";
}

void ExpectSameTrace(const std::vector<StepMetrics>& expected,
                     const std::vector<StepMetrics>& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", expected[i].step));
    EXPECT_EQ(actual[i].step, expected[i].step);
    EXPECT_EQ(actual[i].epoch, expected[i].epoch);
    EXPECT_EQ(actual[i].loss, expected[i].loss);
    EXPECT_EQ(actual[i].lr, expected[i].lr);
    EXPECT_EQ(actual[i].grad_norm, expected[i].grad_norm);
    EXPECT_EQ(actual[i].val_loss, expected[i].val_loss);
  }
}

void ExpectCloseTrace(const std::vector<StepMetrics>& expected,
                      const std::vector<StepMetrics>& actual, double loss_relative,
                      double grad_norm_relative) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", expected[i].step));
    EXPECT_EQ(actual[i].step, expected[i].step);
    EXPECT_EQ(actual[i].epoch, expected[i].epoch);
    EXPECT_EQ(actual[i].lr, expected[i].lr);
    EXPECT_NEAR(actual[i].loss, expected[i].loss, loss_relative * expected[i].loss);
    EXPECT_NEAR(actual[i].grad_norm, expected[i].grad_norm,
                grad_norm_relative * expected[i].grad_norm);
    ASSERT_EQ(actual[i].val_loss.has_value(), expected[i].val_loss.has_value());
    if (expected[i].val_loss) {
      EXPECT_NEAR(*actual[i].val_loss, *expected[i].val_loss,
                  loss_relative * *expected[i].val_loss);
    }
  }
}

void ExpectSameWeights(const std::string& expected_path, const std::string& actual_path) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto expected, checkpoint::CheckpointReader::Open(expected_path));
  KEEL_ASSERT_OK_AND_ASSIGN(auto actual, checkpoint::CheckpointReader::Open(actual_path));
  EXPECT_EQ(actual->manifest().step(), expected->manifest().step());
  ExpectSameModelAndOptimizer(expected_path, actual_path);
}

void ExpectSameModelAndOptimizer(const std::string& expected_path, const std::string& actual_path) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto expected, checkpoint::CheckpointReader::Open(expected_path));
  KEEL_ASSERT_OK_AND_ASSIGN(auto actual, checkpoint::CheckpointReader::Open(actual_path));
  int compared = 0;
  for (const auto& tensor : expected->manifest().tensors()) {
    if (!absl::StartsWith(tensor.name(), "model/") && !absl::StartsWith(tensor.name(), "optim/")) {
      continue;
    }
    SCOPED_TRACE(tensor.name());
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor want, expected->ReadTensor(tensor.name()));
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor got, actual->ReadTensor(tensor.name()));
    EXPECT_TRUE(at::equal(got, want));
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

TensorShapes ExportedTensors(const std::string& ckpt, const std::string& checkpoint,
                             const std::string& out, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {Absolute(ckpt), "export-safetensors", checkpoint, out};
  argv.insert(argv.end(), flags.begin(), flags.end());
  Subprocess child = Subprocess::Start(argv, ChildOptions(out + ".stderr"));
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

}  // namespace keel::tools
