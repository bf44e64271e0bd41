// //tools:train with LoRA adapters (the peft section) on a Hugging Face Llama (the fixture
// llama_gqa_untied: grouped-query heads, untied head), as child processes: the first step is
// the base model's, only the adapters train and are checkpointed (the frozen base comes from
// model.pretrained_path at every start), tensor and pipeline parallelism and data parallelism
// with the distributed optimizer follow the one-rank run, kill -9 resumes to the bit and a
// checkpoint resumes on another layout; bf16 keeps float32 adapters; a checkpoint goes out to
// peft and back; what LoRA cannot do is refused by name.
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/train_testutil.h"

ABSL_FLAG(std::string, ckpt, "", "Path of //tools:ckpt.");
ABSL_FLAG(std::string, eval, "", "Path of //tools:eval.");

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::testing::HasSubstr;

constexpr char kTp2[] = "distributed.tensor_model_parallel_size=2";
constexpr char kLocal8[] = "step_scheduler.local_batch_size=8";

// LoRA of rank 4 on every projection of the fixture (AutoModel's default "*_proj") at a
// learning rate at which the adapters move the loss within a few steps.
std::vector<std::string> Lora(std::vector<std::string> more = {}) {
  std::vector<std::string> args = PretrainedRun("llama_gqa_untied");
  for (const char* field : {"peft.dim=4", "peft.alpha=8", "lr_scheduler.max_lr=1e-2",
                            "lr_scheduler.min_lr=1e-3", "lr_scheduler.lr_warmup_steps=0"}) {
    args.push_back(field);
  }
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The model tensors of a checkpoint: name -> whole shape, and their dtypes.
std::map<std::string, std::vector<int64_t>> ModelTensors(const std::string& checkpoint,
                                                         std::set<std::string>* dtypes = nullptr) {
  std::map<std::string, std::vector<int64_t>> tensors;
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
      checkpoint::CheckpointReader::Open(checkpoint);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return tensors;
  for (const auto& tensor : (*reader)->manifest().tensors()) {
    if (!absl::StartsWith(tensor.name(), "model/")) continue;
    tensors[tensor.name()] = {tensor.shape().begin(), tensor.shape().end()};
    if (dtypes != nullptr) dtypes->insert(tensor.dtype());
  }
  return tensors;
}

// The adapters the fixture's 2 layers get: q, k, v, o, gate, up and down, A [4, in] and
// B [out, 4] (hidden 64, 4 heads of 24, 2 key-value groups, MLP 96).
std::map<std::string, std::vector<int64_t>> ExpectedAdapters() {
  const std::map<std::string, std::pair<int64_t, int64_t>> in_out = {
      {"self_attn.q_proj", {64, 96}}, {"self_attn.k_proj", {64, 48}},
      {"self_attn.v_proj", {64, 48}}, {"self_attn.o_proj", {96, 64}},
      {"mlp.gate_proj", {64, 96}},    {"mlp.up_proj", {64, 96}},
      {"mlp.down_proj", {96, 64}}};
  std::map<std::string, std::vector<int64_t>> adapters;
  for (int layer = 0; layer < 2; ++layer) {
    for (const auto& [module, shape] : in_out) {
      const std::string name =
          absl::StrCat("model/base_model.model.model.layers.", layer, ".", module, ".adapter.");
      adapters[name + "lora_A"] = {4, shape.first};
      adapters[name + "lora_B"] = {shape.second, 4};
    }
  }
  return adapters;
}

// B starts at zero: the first step's loss is the base model's, to the bit. Then only the
// adapters train: the checkpoint holds them and their optimizer state, no base weight.
TEST(TrainLoraTest, StartsAsTheBaseModelAndTrainsOnlyTheAdapters) {
  const std::string base_dir = NewTempDir("base");
  Subprocess base = StartTrain(SameSamplesRun(base_dir, 1, PretrainedRun("llama_gqa_untied")),
                               base_dir + "/stderr");
  ASSERT_EQ(base.Wait(), 0) << base.Stderr();
  const std::string run_dir = NewTempDir("lora");
  Subprocess lora = StartTrain(SameSamplesRun(run_dir, 6, Lora()), run_dir + "/stderr");
  ASSERT_EQ(lora.Wait(), 0) << lora.Stderr();
  EXPECT_THAT(lora.DrainStdout(),
              HasSubstr("model: 28 LoRA adapter tensors (the rest frozen), 8192 trainable "
                        "parameters"));
  const std::vector<recipe::StepMetrics> trace = Metrics(run_dir);
  ASSERT_EQ(trace.size(), 6u);
  EXPECT_EQ(trace[0].loss, Metrics(base_dir)[0].loss);
  EXPECT_LT(trace[5].loss, trace[0].loss);

  const std::string checkpoint = LatestCheckpoint(run_dir);
  std::set<std::string> dtypes;
  EXPECT_EQ(ModelTensors(checkpoint, &dtypes), ExpectedAdapters());
  EXPECT_EQ(dtypes, (std::set<std::string>{"F32"}));
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
      checkpoint::CheckpointReader::Open(checkpoint);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const auto& tensor : (*reader)->manifest().tensors()) {
    if (absl::StartsWith(tensor.name(), "optim/state/")) {
      EXPECT_THAT(tensor.name(), HasSubstr(".adapter.lora_"));
    }
  }
}

// After the model is split, the trainable parameters are exactly the adapters (AutoModel #547
// lost the freeze under tensor parallelism), and every layout computes the one-rank run.
TEST(TrainLoraTest, LayoutsComputeTheOneRankRun) {
  const std::string reference = NewTempDir("reference");
  Subprocess one = StartTrain(SameSamplesRun(reference, 10, Lora()), reference + "/stderr");
  ASSERT_EQ(one.Wait(), 0) << one.Stderr();
  for (const std::vector<std::string>& layout :
       std::vector<std::vector<std::string>>{{kTp2, kLocal8},
                                             {"distributed.pipeline_model_parallel_size=2"},
                                             {"distributed.use_distributed_optimizer=true"}}) {
    SCOPED_TRACE(layout[0]);
    const std::string run_dir = NewTempDir("layout");
    Subprocess ranks =
        LaunchTrain(2, SameSamplesRun(run_dir, 10, Lora(layout)), run_dir + "/stderr");
    ASSERT_EQ(ranks.Wait(), 0) << ranks.Stderr();
    EXPECT_THAT(ranks.DrainStdout(),
                HasSubstr("28 LoRA adapter tensors (the rest frozen), 8192 trainable"));
    ExpectLayoutInvariant(reference, run_dir);
    EXPECT_EQ(ModelTensors(LatestCheckpoint(run_dir)), ExpectedAdapters());
  }
}

// Killed with SIGKILL twice (once with its asynchronous save in flight) at tp=2, resumed each
// time from the adapters' checkpoint and the base's directory: the uninterrupted run, to the bit
// (so the uninterrupted run's frozen base never left the file's bytes either).
TEST(TrainLoraTest, KillNineAndResumeIsBitIdentical) {
  ExpectKillNineResumesBitIdentically("lora_kill", 2, 18, [](const std::string& run_dir) {
    return SameSamplesRun(run_dir, 18, Lora({kTp2, kLocal8}));
  });
}

// One run through 1 rank, tp=2 (whose padded vocabulary, 132 rows, is the frozen base's, not
// the checkpoint's), pp=2 and dp=2 with the distributed optimizer, each leg resuming from the
// last one's checkpoint: the one-rank run's trace.
TEST(TrainLoraTest, CheckpointsResumeOnAnotherLayout) {
  ExpectResumesAcrossLayouts(
      "lora_reshard",
      {{1, {}},
       {2, {kTp2, kLocal8}},
       {2, {"distributed.pipeline_model_parallel_size=2"}},
       {2, {"distributed.use_distributed_optimizer=true"}}},
      /*steps_per_leg=*/6, [](size_t, const std::string&) {}, Lora());
}

// model.bf16: the base in bf16, the adapters stepped as float32 main copies (what the checkpoint
// holds); peft.lora_dtype=float32 keeps the adapters themselves in float32. Both follow the
// float32 run within bf16's rounding, and B has left zero.
TEST(TrainLoraTest, Bf16KeepsFloat32Adapters) {
  const std::string reference = NewTempDir("float32");
  Subprocess float32 = StartTrain(SameSamplesRun(reference, 4, Lora()), reference + "/stderr");
  ASSERT_EQ(float32.Wait(), 0) << float32.Stderr();
  for (const char* lora_dtype : {"base", "float32"}) {
    SCOPED_TRACE(lora_dtype);
    const std::string run_dir = NewTempDir("bf16");
    Subprocess run = StartTrain(
        SameSamplesRun(run_dir, 4,
                       Lora({"model.bf16=true", absl::StrCat("peft.lora_dtype=", lora_dtype)})),
        run_dir + "/stderr");
    ASSERT_EQ(run.Wait(), 0) << run.Stderr();
    const std::string checkpoint = LatestCheckpoint(run_dir);
    std::set<std::string> dtypes;
    EXPECT_EQ(ModelTensors(checkpoint, &dtypes), ExpectedAdapters());
    EXPECT_EQ(dtypes, (std::set<std::string>{"F32"}));
    ExpectCloseTrace(Metrics(reference), Metrics(run_dir), 1e-2, 5e-2);
    absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> reader =
        checkpoint::CheckpointReader::Open(checkpoint);
    ASSERT_TRUE(reader.ok()) << reader.status();
    absl::StatusOr<at::Tensor> b =
        (*reader)->ReadTensor("model/base_model.model.model.layers.1.mlp.down_proj.adapter.lora_B");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_GT(b->abs().max().item<double>(), 0.0);
  }
}

// A tool's exit code and stdout (its stderr into `dir`/<name>.stderr).
std::pair<int, std::string> RunTool(const std::string& binary, const std::vector<std::string>& args,
                                    const std::string& stderr_path) {
  std::vector<std::string> argv = {Absolute(binary)};
  argv.insert(argv.end(), args.begin(), args.end());
  cli::SubprocessOptions options;
  options.stderr_path = stderr_path;
  options.pipe_stdout = true;
  Subprocess child = Subprocess::Start(argv, options);
  std::string out = child.DrainStdout();
  const int code = child.Wait();
  return {code, out + child.Stderr()};
}

// tools:eval's mean loss over the first 6 windows of 16 tokens of HfFixtureTokens.
double EvalMeanLoss(const std::vector<std::string>& model, const std::string& stderr_path) {
  std::vector<std::string> args = {"--data_prefix=" + HfFixtureTokens(), "--sequence_length=16",
                                   "--samples=6"};
  args.insert(args.end(), model.begin(), model.end());
  const auto [code, out] = RunTool(absl::GetFlag(FLAGS_eval), args, stderr_path);
  EXPECT_EQ(code, 0) << out;
  const size_t at = out.find("\"mean_loss\":");
  EXPECT_NE(at, std::string::npos) << out;
  return at == std::string::npos ? 0.0 : std::stod(out.substr(at + 12));
}

// A trained LoRA checkpoint out to Hugging Face and back: tools:eval of the checkpoint (its base
// from model.pretrained_path, its adapters), of the base with the exported peft adapter
// (--adapter) and of the --merge export compute one loss; a new run at pp=2 whose adapters start
// from the export (peft.adapter_path, each stage its own) holds the trained adapters.
TEST(TrainLoraTest, ExportsToPeftAndStartsFromAPeftAdapter) {
  const std::string run_dir = NewTempDir("trained");
  Subprocess train = StartTrain(SameSamplesRun(run_dir, 6, Lora()), run_dir + "/stderr");
  ASSERT_EQ(train.Wait(), 0) << train.Stderr();
  const std::string checkpoint = LatestCheckpoint(run_dir);
  const std::string adapter = run_dir + "/adapter", merged = run_dir + "/merged";
  auto [code, out] = RunTool(absl::GetFlag(FLAGS_ckpt), {"export-safetensors", checkpoint, adapter},
                             run_dir + "/export");
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("wrote a peft LoRA adapter (r 4, lora_alpha 8, 14 modules"));
  std::tie(code, out) =
      RunTool(absl::GetFlag(FLAGS_ckpt), {"export-safetensors", checkpoint, merged, "--merge"},
              run_dir + "/merge");
  ASSERT_EQ(code, 0) << out;
  // The adapter directory has no config.json for --config_from to shape (the merge has).
  std::tie(code, out) = RunTool(absl::GetFlag(FLAGS_ckpt),
                                {"export-safetensors", checkpoint, run_dir + "/adapter2",
                                 "--config_from=" + run_dir + "/merged"},
                                run_dir + "/export2");
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("this export writes no config.json (a peft adapter directory"));

  const double from_checkpoint = EvalMeanLoss({"--model=" + checkpoint}, run_dir + "/eval1");
  const std::string base = PretrainedRun("llama_gqa_untied")[0].substr(22);
  const double base_loss = EvalMeanLoss({"--model=" + base}, run_dir + "/eval0");
  EXPECT_GT(std::abs(from_checkpoint - base_loss), 1e-3);
  EXPECT_NEAR(EvalMeanLoss({"--model=" + base, "--adapter=" + adapter}, run_dir + "/eval2"),
              from_checkpoint, 1e-6);
  EXPECT_NEAR(EvalMeanLoss({"--model=" + merged}, run_dir + "/eval3"), from_checkpoint, 1e-5);

  const std::string started = NewTempDir("from_adapter");
  Subprocess pp2 = LaunchTrain(
      2,
      SameSamplesRun(
          started, 1,
          Lora({"peft.adapter_path=" + adapter, "distributed.pipeline_model_parallel_size=2",
                "optimizer.lr=0", "lr_scheduler.max_lr=0", "lr_scheduler.min_lr=0"})),
      started + "/stderr");
  ASSERT_EQ(pp2.Wait(), 0) << pp2.Stderr();
  EXPECT_THAT(pp2.DrainStdout(), HasSubstr("peft: the adapters start from " + adapter));
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> trained =
      checkpoint::CheckpointReader::Open(checkpoint);
  absl::StatusOr<std::unique_ptr<checkpoint::CheckpointReader>> loaded =
      checkpoint::CheckpointReader::Open(LatestCheckpoint(started));
  ASSERT_TRUE(trained.ok() && loaded.ok());
  const std::map<std::string, std::vector<int64_t>> adapters = ExpectedAdapters();
  EXPECT_EQ(ModelTensors(LatestCheckpoint(started)), adapters);
  for (const auto& [name, shape] : adapters) {
    absl::StatusOr<at::Tensor> a = (*trained)->ReadTensor(name);
    absl::StatusOr<at::Tensor> b = (*loaded)->ReadTensor(name);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    EXPECT_TRUE(at::equal(*a, *b)) << name;
  }

  // The adapter's own fields decide; one that contradicts it is named.
  ExpectRefused(
      1, Lora({"peft.adapter_path=" + adapter, "peft.dim=8"}),
      "peft.dim (8) contradicts peft.adapter_path's " + adapter + "/adapter_config.json (r 4)",
      started + "/contradiction");
}

TEST(TrainLoraTest, WhatLoraCannotDoIsNamed) {
  const std::string run_dir = NewTempDir("refused");
  ExpectRefused(1, Lora({"peft.target_modules=*.qkv"}),
                "peft.target_modules pattern \"*.qkv\" matches none of the model's 15 linear "
                "layers, which are named like: model.layers.0.self_attn.q_proj",
                run_dir + "/pattern");
  // A checkpoint of other adapters (or of the whole model) is another model: refused, kept.
  const std::string resumed = NewTempDir("other_adapters");
  Subprocess first = StartTrain(SameSamplesRun(resumed, 3, Lora()), resumed + "/stderr");
  ASSERT_EQ(first.Wait(), 0) << first.Stderr();
  for (const std::vector<std::string>& other : std::vector<std::vector<std::string>>{
           Lora({"peft.dim=8"}), PretrainedRun("llama_gqa_untied")}) {
    Subprocess again = StartTrain(SameSamplesRun(resumed, 6, other), resumed + "/stderr.again");
    EXPECT_EQ(again.Wait(), 2);
    EXPECT_THAT(again.Stderr(), HasSubstr("holds another model, which this run cannot load: peft"));
  }
  EXPECT_EQ(Metrics(resumed).size(), 3u);
}

}  // namespace
}  // namespace keel::tools
