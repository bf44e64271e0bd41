// Runs the real //tools:ckpt binary on checkpoints saved here and checks its exit status and
// key lines of its output.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json.h"
#include "base/status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_state.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_dict.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/hf_config.h"
#include "models/registry.h"
#include "peft/lora_adapter.h"
#include "peft/lora_options.h"
#include "peft/module_matcher.h"
#include "testing/files.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

ABSL_FLAG(std::string, ckpt, "", "Path of the //tools:ckpt binary.");
ABSL_FLAG(std::string, python, "", "the Python of the LibTorch (@libtorch//:python)");
ABSL_FLAG(std::string, hf_parity, "", "tools/scripts/hf_parity.py");
ABSL_FLAG(std::string, fixtures, "testdata/hf_parity", "the Hugging Face fixtures' directory");

namespace keel::tools {
namespace {

using ::keel::base::Json;
using ::keel::checkpoint::Checkpointer;
using ::keel::checkpoint::CheckpointerOptions;
using ::keel::checkpoint::Manifest;
using ::keel::checkpoint::State;
using ::keel::checkpoint::StateReader;
using ::keel::testing::FlipBit;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Saves whole tensors and values; loading is not needed here.
class PlainState : public checkpoint::Stateful {
 public:
  std::map<std::string, at::Tensor> tensors;
  Json values = Json::object();

  absl::StatusOr<State> StateDict() const override {
    State state;
    for (const auto& [key, tensor] : tensors) state.tensors[key] = {tensor};
    state.values = values;
    return state;
  }
  absl::Status LoadStateDict(StateReader&) override { return absl::OkStatus(); }
};

PlainState Model() {
  PlainState model;
  at::manual_seed(1);
  model.tensors["w"] = at::randn({4, 3});                 // 48 bytes
  model.tensors["b"] = at::randn({3}).to(at::kBFloat16);  // 6 bytes
  model.values = {{"lr", 0.5}, {"name", "gpt"}};
  return model;
}

// Saves `model` as step `step` under `run_dir`; returns the checkpoint's path.
absl::StatusOr<std::string> Save(const std::string& run_dir, int64_t step,
                                 const PlainState& model) {
  CheckpointerOptions options;
  options.checkpoint_dir = run_dir;
  KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, nullptr));
  PlainState copy = model;
  KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &copy}}, step, /*epoch=*/1));
  return absl::StrFormat("%s/step_%010d", run_dir, step);
}

std::string NewDir(const std::string& name) { return keel::testing::NewTempDir(name); }

struct ToolResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ToolResult Run(const std::string& program, const std::string& args, const std::string& env) {
  const std::string command = absl::StrCat(env, " ", program, " ", args, " 2>&1");
  ToolResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t read;
  while ((read = ::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, read);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

ToolResult RunCkpt(const std::string& args, const std::string& env = "") {
  return Run(absl::GetFlag(FLAGS_ckpt), args, env);
}

TEST(CkptToolTest, InspectPrintsPositionTablesValuesAndTotals) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string path, Save(NewDir("inspect"), 5, Model()));
  const ToolResult result = RunCkpt(absl::StrCat("inspect ", path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("step 5, epoch 1, world size 1, format KEEL, Keel "),
                    HasSubstr("  model/b  BF16   [3]          1      6\n"),
                    HasSubstr("  model/w  F32    [4, 3]       1     48\n"), HasSubstr("__0.keel"),
                    HasSubstr("  model  {\"lr\":0.5,\"name\":\"gpt\"}\n"),
                    HasSubstr("total: 2 tensors, 54 tensor bytes; 1 files, ")));
}

TEST(CkptToolTest, VerifyPassesThenNamesTheCorruptTensor) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string path, Save(NewDir("verify"), 1, Model()));
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, checkpoint::ReadManifest(path));
  ToolResult result = RunCkpt(absl::StrCat("verify ", path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr(absl::StrCat("OK: 1 files, 2 tensors, ",
                                                    manifest.files(0).size(), " bytes verified")));

  ASSERT_EQ(manifest.tensors(1).name(), "model/w");
  FlipBit(absl::StrCat(path, "/", manifest.files(0).name()),
          manifest.tensors(1).chunks(0).byte_offset() + 3);
  result = RunCkpt(absl::StrCat("verify ", path));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("FAILED"), HasSubstr("\"model/w\"")));
}

// The newest checkpoint that verifies, every byte: newer ones, truncated or with a flipped bit
// (which only the checksums show; it was once reported FAILED), are what a resume sets aside.
TEST(CkptToolTest, VerifyOfARunDirectoryChecksWhatAResumeWouldLoad) {
  const std::string run = NewDir("run");
  KEEL_ASSERT_OK(Save(run, 1, Model()).status());
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string truncated, Save(run, 2, Model()));
  std::filesystem::resize_file(absl::StrCat(truncated, "/__0.keel"), 10);
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string flipped, Save(run, 3, Model()));
  KEEL_ASSERT_OK_AND_ASSIGN(Manifest manifest, checkpoint::ReadManifest(flipped));
  FlipBit(absl::StrCat(flipped, "/", manifest.files(0).name()),
          manifest.tensors(1).chunks(0).byte_offset() + 3);
  const ToolResult result = RunCkpt(absl::StrCat("verify ", run));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(
      result.output,
      AllOf(HasSubstr("warning: skipping " + flipped), HasSubstr("\"model/w\""),
            HasSubstr("warning: skipping " + truncated), HasSubstr("(a resume sets it aside)"),
            HasSubstr("newest valid checkpoint: " + run + "/step_0000000001"),
            HasSubstr("OK: 1 files, 2 tensors"), Not(HasSubstr("FAILED"))));
}

TEST(CkptToolTest, DiffFindsIdenticalAndChangedCheckpoints) {
  const std::string run = NewDir("diff");
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string a, Save(run, 1, Model()));
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string same, Save(run, 2, Model()));
  ToolResult result = RunCkpt(absl::StrCat("diff ", a, " ", same));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("identical: 2 tensors, 1 objects"));

  PlainState changed = Model();
  changed.tensors["w"] = changed.tensors["w"].clone();
  changed.tensors["w"][0][0] += 3;
  changed.tensors["extra"] = at::zeros({2});
  changed.values["lr"] = 0.25;
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string b, Save(run, 3, changed));
  result = RunCkpt(absl::StrCat("diff ", a, " ", b));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(
      result.output,
      AllOf(HasSubstr("tensor model/extra: only in B"), HasSubstr("tensor model/w: max |A-B| 3,"),
            HasSubstr("values model.lr: 0.5 in A, 0.25 in B"),
            HasSubstr("3 differences; 1 tensors identical"), Not(HasSubstr("tensor model/b"))));
}

// Saves Model() as "model" (values alike on every rank) and "stage" ({"stage": <rank> +
// stage_offset} for ranks above 0) on 2 ranks as step `step` under `run_dir`.
absl::StatusOr<std::string> SaveStages(const std::string& run_dir, int64_t step,
                                       int stage_offset = 0) {
  const PlainState saved = Model();  // here: ranks are threads, and Model() seeds torch
  KEEL_RETURN_IF_ERROR(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    CheckpointerOptions options;
    options.checkpoint_dir = run_dir;
    KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, r.group.get()));
    PlainState model = saved;
    PlainState stage;
    stage.values = {{"stage", r.rank == 0 ? 0 : r.rank + stage_offset}};
    return checkpointer->Save({{"model", &model}, {"stage", &stage}}, step, /*epoch=*/1);
  }));
  return absl::StrFormat("%s/step_%010d", run_dir, step);
}

TEST(CkptToolTest, InspectAndVerifyShowValuesPerRank) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string path, SaveStages(NewDir("per_rank"), 3));
  ToolResult result = RunCkpt(absl::StrCat("inspect ", path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("world size 2, format KEEL, Keel 0.1.0 (format version 2)\n"),
                    HasSubstr("objects:\n"
                              "  name   rank  values\n"
                              "  model   all  {\"lr\":0.5,\"name\":\"gpt\"}\n"
                              "  stage     0  {\"stage\":0}\n"
                              "  stage     1  {\"stage\":1}\n"),
                    HasSubstr(" bytes on disk; 2 objects (1 with values per rank)\n")));
  result = RunCkpt(absl::StrCat("verify ", path));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr(" bytes verified; 2 objects (1 with values per rank)\n"));
}

TEST(CkptToolTest, DiffComparesValuesPerRankRankByRank) {
  const std::string run = NewDir("diff_per_rank");
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string a, SaveStages(run, 1));
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string b, SaveStages(run, 2, /*stage_offset=*/4));
  ToolResult result = RunCkpt(absl::StrCat("diff ", a, " ", b));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("values stage[rank 1].stage: 1 in A, 5 in B\n"),
                                   HasSubstr("1 differences; 2 tensors identical")));

  PlainState stage;
  stage.values = {{"stage", 0}};
  CheckpointerOptions options;
  options.checkpoint_dir = run;
  KEEL_ASSERT_OK_AND_ASSIGN(auto checkpointer, Checkpointer::Create(options, nullptr));
  PlainState model = Model();
  KEEL_ASSERT_OK(checkpointer->Save({{"model", &model}, {"stage", &stage}}, 3, /*epoch=*/1));
  result = RunCkpt(absl::StrCat("diff ", a, " ", run, "/step_0000000003"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("values stage: values of 2 ranks in A, 1 in B\n"));
}

TEST(CkptToolTest, ExportSafetensorsWritesTheShardsAndIndex) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string path, Save(NewDir("export_run"), 1, Model()));
  const std::string out = NewDir("export_out") + "/export";
  // b (6 bytes) then w (48): 54 > 48, so two files.
  const ToolResult result =
      RunCkpt(absl::StrCat("export-safetensors ", path, " ", out, " --max_shard_bytes=48"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* file : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"}) {
    EXPECT_TRUE(std::filesystem::exists(absl::StrCat(out, "/", file))) << file;
  }
  // A second export into the same directory refuses to overwrite it: a failure (exit 1).
  const ToolResult again = RunCkpt(absl::StrCat("export-safetensors ", path, " ", out));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.output, HasSubstr("ckpt: "));
}

// A run's checkpoint_dir exports its newest valid checkpoint, as eval and verify take it.
TEST(CkptToolTest, ExportSafetensorsOfARunDirectoryTakesItsNewestValidCheckpoint) {
  const std::string run = NewDir("export_newest");
  KEEL_ASSERT_OK(Save(run, 1, Model()).status());
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string truncated, Save(run, 2, Model()));
  std::filesystem::resize_file(absl::StrCat(truncated, "/__0.keel"), 10);
  const std::string out = NewDir("export_newest_out") + "/export";
  const ToolResult result = RunCkpt(absl::StrCat("export-safetensors ", run, " ", out));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              AllOf(HasSubstr("warning: skipping " + truncated),
                    HasSubstr("newest valid checkpoint: " + run + "/step_0000000001"),
                    HasSubstr("wrote 2 tensors")));
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors"));
  const ToolResult empty =
      RunCkpt(absl::StrCat("export-safetensors ", NewDir("export_empty"), " ", out + "2"));
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_THAT(empty.output, HasSubstr("holds neither a checkpoint manifest nor committed step_*"));
}

// --dtype rounds the floating-point tensors (the trainer's bf16 runs are in train_bf16_test);
// a dtype it does not know is bad usage (exit 2), naming what is allowed, before anything is
// written.
TEST(CkptToolTest, ExportSafetensorsWritesTheDtypeAsked) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string path, Save(NewDir("export_dtype"), 1, Model()));
  const std::string out = NewDir("export_dtype_out") + "/export";
  const ToolResult result =
      RunCkpt(absl::StrCat("export-safetensors ", path, " ", out, " --dtype=bfloat16"));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("of \"model\" in BFloat16 to "));
  KEEL_ASSERT_OK_AND_ASSIGN(const auto header,
                            checkpoint::ReadSafetensorsHeader(out + "/model.safetensors"));
  for (const checkpoint::SafetensorsEntry& entry : header.entries) {
    EXPECT_EQ(entry.dtype, at::kBFloat16) << entry.name;
  }
  const std::string bad = NewDir("export_bad_dtype") + "/export";
  const ToolResult refused =
      RunCkpt(absl::StrCat("export-safetensors ", path, " ", bad, " --dtype=fp8"));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.output,
              HasSubstr("--dtype=fp8: allowed: bfloat16, float32, or empty (the model's)"));
  EXPECT_FALSE(std::filesystem::exists(bad));
  // --config_from shapes a config.json; an export that writes none refuses it, once ignored.
  const ToolResult no_config = RunCkpt(absl::StrCat("export-safetensors ", path, " ", bad,
                                                    " --config_from=testdata/hf_parity/qwen3"));
  EXPECT_EQ(no_config.exit_code, 2);
  EXPECT_THAT(no_config.output,
              HasSubstr("--config_from=testdata/hf_parity/qwen3: this export writes no "
                        "config.json (the checkpoint holds no trainer configuration"));
  EXPECT_FALSE(std::filesystem::exists(bad));
}

TEST(CkptToolTest, RelativePathsAreResolvedFromTheBazelRunDirectory) {
  const std::string run = NewDir("relative");
  KEEL_ASSERT_OK(Save(run, 7, Model()).status());
  const std::filesystem::path relative = std::filesystem::path(run).filename() / "step_0000000007";
  const ToolResult result = RunCkpt(
      absl::StrCat("inspect ", relative.string()),
      absl::StrCat("BUILD_WORKING_DIRECTORY=", std::filesystem::path(run).parent_path().string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("step 7,"));
}

TEST(CkptToolTest, BadCommandLinesPrintUsage) {
  for (const char* args : {"", "frobnicate x", "inspect", "diff only_one"}) {
    SCOPED_TRACE(args);
    const ToolResult result = RunCkpt(args);
    EXPECT_EQ(result.exit_code, 2);
    EXPECT_THAT(result.output,
                AllOf(HasSubstr("inspect DIR"), HasSubstr("verify DIR"), HasSubstr("diff A B"),
                      HasSubstr("export-safetensors DIR OUT")));
  }
}

// A checkpoint that cannot be read is a failure (exit 1), not bad usage (2).
TEST(CkptToolTest, ErrorsNameTheProblemAndExitWith1) {
  const ToolResult result =
      RunCkpt(absl::StrCat("inspect ", NewDir("missing"), "/no_such_checkpoint"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, AllOf(HasSubstr("ckpt: "), HasSubstr("no_such_checkpoint")));
}

// A LoRA run's checkpoint as tools:train saves it: the adapters of the Llama of
// testdata/hf_parity/llama_gqa_untied (every *_proj, r 4, alpha 12; B random, as after
// training) under ModelState's is_peft keys, and the configuration with model.pretrained_path
// and the peft section; beside it, Keel's logits of the fixture's input_ids.
struct LoraRun {
  std::string checkpoint;
  std::string expected;  // a safetensors file: input_ids, logits
  std::string base;
  // check-peft's tolerance: 1e-5 of the logits' largest magnitude, as the Llama's parity with
  // transformers (models/llama_hf_parity_test.cc).
  double tolerance = 0;
};

absl::StatusOr<LoraRun> SaveLoraRun(const std::string& run_dir,
                                    const std::string& pretrained_path) {
  LoraRun run;
  run.base = std::filesystem::absolute(absl::GetFlag(FLAGS_fixtures) + "/llama_gqa_untied");
  KEEL_ASSIGN_OR_RETURN(const models::ModelOptions options, models::ReadHfConfig(run.base));
  torch::manual_seed(5);
  const std::shared_ptr<models::LanguageModel> model = models::BuildLanguageModel(options, {});
  KEEL_RETURN_IF_ERROR(checkpoint::LoadHfSafetensors(run.base, *model).status());
  peft::LoraOptions lora;
  lora.dim = 4;
  lora.alpha = 12;
  KEEL_ASSIGN_OR_RETURN(const auto modules, peft::SelectLinearModules(*model, lora));
  KEEL_RETURN_IF_ERROR(peft::AttachLoraAdapters(*model, modules, lora));
  {
    at::NoGradGuard no_grad;
    for (const auto& item : model->named_parameters()) {
      if (absl::EndsWith(item.key(), ".lora_B")) item.value().normal_(0.0, 0.3);
    }
  }
  KEEL_ASSIGN_OR_RETURN(auto fixture,
                        checkpoint::ReadSafetensorsFile(run.base + "/expected.safetensors"));
  at::Tensor input_ids;
  for (const auto& [name, tensor] : fixture) {
    if (name == "input_ids") input_ids = tensor;
  }
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = model->forward(input_ids).narrow(-1, 0, options.vocab_size).contiguous();
  }
  run.tolerance = 1e-5 * std::max(1.0, logits.abs().max().item<double>());
  run.expected = run_dir + "/expected.safetensors";
  KEEL_RETURN_IF_ERROR(checkpoint::WriteSafetensorsFile(
      run.expected, {{"input_ids", input_ids}, {"logits", logits}}, {}));

  checkpoint::ModelStateOptions state_options;
  state_options.is_peft = true;
  checkpoint::ModelState state(*model, state_options);
  PlainState config;
  Json model_section = base::WriteJsonFields(options);
  model_section["pretrained_path"] = pretrained_path.empty() ? "" : run.base;
  config.values = {{"model", model_section}, {"peft", base::WriteJsonFields(lora)}};
  CheckpointerOptions checkpointer_options;
  checkpointer_options.checkpoint_dir = run_dir + "/checkpoints";
  KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(checkpointer_options, nullptr));
  KEEL_RETURN_IF_ERROR(checkpointer->Save({{"model", &state}, {"config", &config}}, 3, 1));
  run.checkpoint = run_dir + "/checkpoints/step_0000000003";
  return run;
}

ToolResult CheckPeft(const std::string& args) {
  return Run(absl::GetFlag(FLAGS_python),
             absl::StrCat(absl::GetFlag(FLAGS_hf_parity), " check-peft ", args),
             "HF_HUB_OFFLINE=1");
}

// The adapter of a LoRA checkpoint in peft's format: peft.PeftModel.from_pretrained over the
// base computes Keel's logits (hf_parity.py check-peft); with --merge, the merged model that
// transformers loads computes them as well (peft's merge_and_unload()).
TEST(CkptToolTest, ExportOfALoraCheckpointLoadsInPeftAndMergedInTransformers) {
  const std::string python = absl::GetFlag(FLAGS_python);
  if (auto why = keel::testing::WhyNotExecutable(python)) GTEST_SKIP() << *why;
  const std::string dir = NewDir("lora_export");
  KEEL_ASSERT_OK_AND_ASSIGN(const LoraRun run, SaveLoraRun(dir, "base"));

  const std::string adapter = dir + "/adapter";
  ToolResult result = RunCkpt(absl::StrCat("export-safetensors ", run.checkpoint, " ", adapter));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("wrote a peft LoRA adapter (r 4, lora_alpha 12, 14 modules, "
                                       "28 tensors)"));
  KEEL_ASSERT_OK_AND_ASSIGN(const Json config,
                            base::ReadJsonFile(adapter + "/adapter_config.json"));
  EXPECT_EQ(config["base_model_name_or_path"], run.base);
  result = CheckPeft(absl::StrCat("--base=", run.base, " --adapter=", adapter,
                                  " --expected=", run.expected, " --tolerance=", run.tolerance));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("\"ok\": true"));

  const std::string merged = dir + "/merged";
  result = RunCkpt(absl::StrCat("export-safetensors ", run.checkpoint, " ", merged, " --merge"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, AllOf(HasSubstr("config.json"), HasSubstr("model.safetensors")));
  result = CheckPeft(absl::StrCat("--merged=", merged, " --expected=", run.expected,
                                  " --tolerance=", run.tolerance));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("\"ok\": true"));

  // Into a directory that holds an adapter: refused (exit 1), nothing overwritten.
  result = RunCkpt(absl::StrCat("export-safetensors ", run.checkpoint, " ", adapter));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("already holds an adapter"));
}

// --merge reads the base from model.pretrained_path (a failure, exit 1, naming it when empty);
// on a checkpoint without an adapter it is bad usage (exit 2).
TEST(CkptToolTest, MergeNeedsTheRunsPretrainedPathAndALoraCheckpoint) {
  const std::string dir = NewDir("lora_no_base");
  KEEL_ASSERT_OK_AND_ASSIGN(const LoraRun run, SaveLoraRun(dir, ""));
  ToolResult result =
      RunCkpt(absl::StrCat("export-safetensors ", run.checkpoint, " ", dir + "/merged --merge"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.output, HasSubstr("model.pretrained_path, which"));
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string plain, Save(NewDir("not_lora"), 1, Model()));
  result = RunCkpt(absl::StrCat("export-safetensors ", plain, " ", dir + "/merged2 --merge"));
  EXPECT_EQ(result.exit_code, 2);  // bad usage
  EXPECT_THAT(result.output, HasSubstr("--merge: \"model\" of"));
}

}  // namespace
}  // namespace keel::tools
