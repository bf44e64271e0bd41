// Runs the real //tools:eval binary. Its losses are checked against transformers' logits of the
// fixtures in testdata/hf_parity (recorded by tools/scripts/hf_parity.py, not computed by Keel):
// a dataset holding one recorded row of 17 tokens is one window of 16, whose loss is the mean
// cross-entropy of the recorded logits at positions 0..15 against tokens 1..16 (the logits of a
// causal model at those positions do not depend on the row's last token). Bad input is named.
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/sft_testutil.h"

ABSL_FLAG(std::string, eval, "", "Path of the //tools:eval binary.");
ABSL_FLAG(std::string, python, "", "The Python of Keel's LibTorch (@libtorch//:python).");
ABSL_FLAG(std::string, hf_parity, "", "Path of tools/scripts/hf_parity.py.");

namespace keel::tools {
namespace {

using ::keel::tools::cli::With;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct ToolResult {
  int exit_code;
  std::vector<base::Json> lines;
  std::string err;
};

ToolResult RunEval(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {absl::GetFlag(FLAGS_eval)};
  argv.insert(argv.end(), args.begin(), args.end());
  cli::SubprocessOptions options;
  options.stderr_path = keel::testing::NewTempDir("eval_stderr") + "/stderr";
  options.pipe_stdout = true;
  cli::Subprocess child = cli::Subprocess::Start(argv, options);
  const std::string out = child.DrainStdout();
  ToolResult result{child.Wait(), {}, child.Stderr()};
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) {
    result.lines.push_back(base::Json::parse(line));
  }
  return result;
}

// An indexed dataset of one document holding `tokens`; its prefix.
std::string WriteTokens(const std::string& name, const std::vector<int64_t>& tokens) {
  const std::string prefix = keel::testing::NewTempDir(name) + "/tokens";
  absl::StatusOr<sampling::IndexedDatasetWriter> writer =
      sampling::IndexedDatasetWriter::Create(prefix, sampling::TokenDtype::kUint16);
  EXPECT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}).ok());
  EXPECT_TRUE(writer->Finalize().ok());
  return prefix;
}

std::map<std::string, at::Tensor> Expected(const std::string& fixture) {
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> tensors =
      checkpoint::ReadSafetensorsFile("testdata/hf_parity/" + fixture + "/expected.safetensors");
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  return tensors.ok() ? std::map<std::string, at::Tensor>(tensors->begin(), tensors->end())
                      : std::map<std::string, at::Tensor>{};
}

TEST(EvalToolTest, LossesAreTransformersOnEveryFamily) {
  // Mistral's window (8) is shorter than the 16 positions: the window applies.
  for (const std::string fixture :
       {"llama_tied", "llama_gqa_untied", "qwen2", "qwen3", "mistral"}) {
    const std::map<std::string, at::Tensor> expected = Expected(fixture);
    ASSERT_TRUE(expected.count("input_ids") && expected.count("logits")) << fixture;
    for (int64_t row = 0; row < 2; ++row) {
      SCOPED_TRACE(absl::StrCat(fixture, " row ", row));
      const at::Tensor ids = expected.at("input_ids")[row];  // 17 tokens
      const std::vector<int64_t> tokens(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 17);
      const double want =
          at::cross_entropy_loss(expected.at("logits")[row].narrow(0, 0, 16), ids.narrow(0, 1, 16))
              .item<double>();
      const ToolResult result = RunEval({"--model=testdata/hf_parity/" + fixture,
                                         "--data_prefix=" + WriteTokens(fixture, tokens),
                                         "--sequence_length=16", "--samples=1"});
      ASSERT_EQ(result.exit_code, 0) << result.err;
      ASSERT_EQ(result.lines.size(), 2u);
      EXPECT_EQ(result.lines[0]["window"], 0);
      EXPECT_EQ(result.lines[0]["tokens"], 16);
      EXPECT_NEAR(result.lines[0]["loss"].get<double>(), want, 1e-5);
      EXPECT_EQ(result.lines[1]["tokens"], 16);
      EXPECT_NEAR(result.lines[1]["mean_loss"].get<double>(), want, 1e-5);
      EXPECT_NEAR(result.lines[1]["perplexity"].get<double>(), std::exp(want),
                  1e-4 * std::exp(want));
      EXPECT_THAT(result.err, HasSubstr("model: "));
    }
  }
}

// Windows overlap by one token and are batched: each window's loss is the one-window run's
// on its own 17 tokens, whatever the batch it falls in.
TEST(EvalToolTest, WindowsAreConsecutiveSpansOfTheTokensEndToEnd) {
  std::vector<int64_t> tokens(5 * 8 + 3);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 37 + 11) % 131;
  const std::string model = "--model=testdata/hf_parity/qwen3";
  const ToolResult all = RunEval({model, "--data_prefix=" + WriteTokens("all", tokens),
                                  "--sequence_length=8", "--samples=5", "--batch_size=2"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  ASSERT_EQ(all.lines.size(), 6u);
  double sum = 0;
  for (int64_t w = 0; w < 5; ++w) {
    SCOPED_TRACE(w);
    const std::vector<int64_t> window(tokens.begin() + w * 8, tokens.begin() + w * 8 + 9);
    const ToolResult one = RunEval({model, "--data_prefix=" + WriteTokens("one", window),
                                    "--sequence_length=8", "--samples=1"});
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_EQ(all.lines[w]["window"], w);
    EXPECT_NEAR(all.lines[w]["loss"].get<double>(), one.lines[0]["loss"].get<double>(), 1e-6);
    sum += all.lines[w]["loss"].get<double>();
  }
  EXPECT_NEAR(all.lines[5]["mean_loss"].get<double>(), sum / 5, 1e-12);
  EXPECT_EQ(all.lines[5]["tokens"], 40);
}

// A copy of fixture `name` in a new directory, its tensors through `tensors` and its
// config.json through `config`: a malformed or converted Hugging Face directory.
std::string CopyFixture(
    const std::string& name,
    const std::function<void(std::vector<std::pair<std::string, at::Tensor>>&)>& tensors,
    const std::function<void(base::Json&)>& config) {
  const std::string dir = keel::testing::NewTempDir(name);
  const std::string from = "testdata/hf_parity/" + name;
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> read =
      checkpoint::ReadSafetensorsFile(from + "/model.safetensors");
  EXPECT_TRUE(read.ok()) << read.status();
  tensors(*read);
  EXPECT_TRUE(checkpoint::WriteSafetensorsFile(dir + "/model.safetensors", *read, {}).ok());
  absl::StatusOr<base::Json> json = base::ReadJsonFile(from + "/config.json");
  EXPECT_TRUE(json.ok()) << json.status();
  config(*json);
  EXPECT_TRUE(base::WriteJsonFile(dir + "/config.json", *json).ok());
  return dir;
}

// Most checkpoints on the Hub are bf16: they evaluate in float32 (the default) and in bf16,
// each near the float32 fixture's loss (bf16 weights, and in bf16 activations too, round
// within 1% of the loss of about 4.9 here).
TEST(EvalToolTest, Bf16WeightsEvaluateInEitherDtype) {
  const std::string bf16 = CopyFixture(
      "llama_gqa_untied",
      [](auto& tensors) {
        for (auto& [name, tensor] : tensors) tensor = tensor.to(at::kBFloat16);
      },
      [](base::Json&) {});
  std::vector<int64_t> tokens(17);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 37 + 11) % 131;
  const std::vector<std::string> data = {"--data_prefix=" + WriteTokens("bf16", tokens),
                                         "--sequence_length=16", "--samples=1"};
  std::vector<std::string> args = data;
  args.push_back("--model=testdata/hf_parity/llama_gqa_untied");
  const ToolResult float32 = RunEval(args);
  ASSERT_EQ(float32.exit_code, 0) << float32.err;
  const double reference = float32.lines.back()["mean_loss"].get<double>();
  for (const std::string dtype : {"float32", "bfloat16"}) {
    SCOPED_TRACE(dtype);
    args = data;
    args.push_back("--model=" + bf16);
    args.push_back("--dtype=" + dtype);
    const ToolResult result = RunEval(args);
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NEAR(result.lines.back()["mean_loss"].get<double>(), reference, reference * 1e-2);
  }
}

// Directories made by transformers and then corrupted, and values transformers refuses: each
// is an error naming what is wrong (exit 1 or 2), never a crash or a silent load.
TEST(EvalToolTest, MalformedDirectoriesAreNamed) {
  struct Case {
    std::string name;
    std::string dir;
    std::string said;
  };
  const auto same = [](auto&) {};
  const std::vector<Case> cases = {
      {"0-d tied head",
       CopyFixture(
           "llama_tied",
           [](auto& tensors) { tensors.emplace_back("lm_head.weight", at::zeros({})); }, same),
       "\"lm_head.weight\""},
      {"ten million layers",
       CopyFixture("llama_tied", same, [](base::Json& c) { c["num_hidden_layers"] = 10000000; }),
       "\"num_hidden_layers\" is 10000000, but the safetensors files hold 2 layers"},
      {"a 2^30 intermediate size",
       CopyFixture("llama_tied", same,
                   [](base::Json& c) { c["intermediate_size"] = int64_t{1} << 30; }),
       "mlp.gate_proj.weight\" is [1073741824, 64] by config.json"},
      {"a 2^40 intermediate size",
       CopyFixture("llama_tied", same,
                   [](base::Json& c) { c["intermediate_size"] = int64_t{1} << 40; }),
       "\"intermediate_size\" is 1099511627776; it must be at most 2147483647"},
      {"2^40 heads of every kind",
       CopyFixture("llama_tied", same,
                   [](base::Json& c) {
                     c["num_attention_heads"] = int64_t{1} << 40;
                     c["num_key_value_heads"] = int64_t{1} << 40;
                   }),
       "config.json"},
      {"a negative epsilon",
       CopyFixture("llama_tied", same, [](base::Json& c) { c["rms_norm_eps"] = -1; }),
       "\"rms_norm_eps\" is -1"},
  };
  const std::string prefix = WriteTokens("malformed", {1, 2, 3, 4, 5, 6, 7, 8, 9});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ToolResult result = RunEval(
        {"--model=" + c.dir, "--data_prefix=" + prefix, "--sequence_length=8", "--samples=1"});
    EXPECT_TRUE(result.exit_code == 1 || result.exit_code == 2) << result.exit_code;
    EXPECT_TRUE(result.lines.empty());
    EXPECT_THAT(result.err, HasSubstr(c.said));
  }
}

// --adapter: the peft adapter that peft saved (testdata/hf_parity/llama_gqa_untied_lora) over its
// base evaluates as peft.PeftModel.from_pretrained computes it (hf_parity.py check-eval
// --adapter), and not as the base alone; a directory that is no adapter is named.
TEST(EvalToolTest, APeftAdapterEvaluatesAsInPeft) {
  std::vector<int64_t> tokens(4 * 12 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 53 + 7) % 131;
  const std::string prefix = WriteTokens("adapter", tokens);
  const std::vector<std::string> args = {"--model=testdata/hf_parity/llama_gqa_untied",
                                         "--data_prefix=" + prefix, "--sequence_length=12",
                                         "--samples=4"};
  std::vector<std::string> with_adapter = args;
  with_adapter.push_back("--adapter=testdata/hf_parity/llama_gqa_untied_lora");
  const ToolResult adapted = RunEval(with_adapter);
  ASSERT_EQ(adapted.exit_code, 0) << adapted.err;
  EXPECT_THAT(adapted.err, HasSubstr("with the peft LoRA adapter "
                                     "testdata/hf_parity/llama_gqa_untied_lora (r 4, lora_alpha 8, "
                                     "6 layers)"));
  const ToolResult base = RunEval(args);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  ASSERT_EQ(adapted.lines.size(), 5u);
  EXPECT_GT(std::abs(adapted.lines[4]["mean_loss"].get<double>() -
                     base.lines[4]["mean_loss"].get<double>()),
            1e-3);

  std::vector<std::string> not_adapter = args;
  not_adapter.push_back("--adapter=testdata/hf_parity/llama_tied");
  const ToolResult refused = RunEval(not_adapter);
  EXPECT_EQ(refused.exit_code, 1) << refused.err;  // as a missing --model
  EXPECT_THAT(refused.err, AllOf(HasSubstr("--adapter"), HasSubstr("adapter_config.json")));

  // A config whose r is not its tensors' (here 2^40, too large to allocate: the allocator's
  // exception once ended the tool) is refused before any adapter is built.
  const std::string huge = keel::testing::NewTempDir("huge_r");
  KEEL_ASSERT_OK_AND_ASSIGN(
      base::Json config,
      base::ReadJsonFile("testdata/hf_parity/llama_gqa_untied_lora/adapter_config.json"));
  config["r"] = int64_t{1} << 40;
  KEEL_ASSERT_OK(base::WriteJsonFile(huge + "/adapter_config.json", config));
  keel::testing::WriteFileOrFail(
      huge + "/adapter_model.safetensors",
      keel::testing::ReadFileOrFail(
          "testdata/hf_parity/llama_gqa_untied_lora/adapter_model.safetensors"));
  std::vector<std::string> huge_adapter = args;
  huge_adapter.push_back("--adapter=" + huge);
  const ToolResult too_large = RunEval(huge_adapter);
  EXPECT_EQ(too_large.exit_code, 1) << too_large.err;  // as the files that do not fit below
  EXPECT_THAT(too_large.err, AllOf(HasSubstr("--adapter: "), HasSubstr("r 1099511627776 of "),
                                   HasSubstr("the config is not the adapter's")));

  const std::string python = absl::GetFlag(FLAGS_python);
  if (auto why = keel::testing::WhyNotExecutable(python)) GTEST_SKIP() << *why;
  const std::string keel = keel::testing::NewTempDir("adapter_eval") + "/eval.jsonl";
  std::string lines;
  for (const base::Json& line : adapted.lines) lines += line.dump() + "\n";
  keel::testing::WriteFileOrFail(keel, lines);
  cli::SubprocessOptions options;
  options.stderr_path = keel + ".stderr";
  options.pipe_stdout = true;
  options.add_environment = {"HF_HUB_OFFLINE=1"};
  cli::Subprocess check = cli::Subprocess::Start(
      {python, absl::GetFlag(FLAGS_hf_parity), "check-eval",
       "--dir=testdata/hf_parity/llama_gqa_untied",
       "--adapter=testdata/hf_parity/llama_gqa_untied_lora", "--data_prefix=" + prefix,
       "--sequence_length=12", "--keel=" + keel, "--tolerance=1e-5"},
      options);
  const std::string verdict = check.DrainStdout();
  EXPECT_EQ(check.Wait(), 0) << verdict << check.Stderr();
  EXPECT_THAT(verdict, HasSubstr("\"ok\": true"));
}

// `result` of --data_format=sft --samples=4 on the fixture: each conversation's mean loss over
// its learned tokens and their count as transformers computed them, then the mean over all.
void ExpectFixtureFigures(const ToolResult& result, const SftFixture& fixture) {
  ASSERT_EQ(result.exit_code, 0) << result.err;
  ASSERT_EQ(result.lines.size(), 5u);
  for (size_t c = 0; c < 4; ++c) {
    SCOPED_TRACE(c);
    EXPECT_EQ(result.lines[c]["sample"], c);
    EXPECT_EQ(result.lines[c]["tokens"], fixture.label_tokens[c]);
    const double expected = fixture.loss_sums[c] / fixture.label_tokens[c];
    EXPECT_NEAR(result.lines[c]["loss"].get<double>(), expected, 1e-5 * expected);
  }
  EXPECT_NEAR(result.lines[4]["mean_loss"].get<double>(), fixture.loss, 1e-5 * fixture.loss);
}

// --data_format=sft: each conversation of the fixture whole, its loss the mean over its learned
// tokens, as transformers computes it (labels -100 where not learned), and the mean over all.
TEST(EvalToolTest, ConversationsEvaluateAsTransformersAnswerOnlyLoss) {
  const SftFixture fixture = ReadSftFixture();
  const std::string prefix = WriteConversations("eval_sft", fixture.conversations);
  const ToolResult result =
      RunEval({"--model=testdata/hf_parity/llama_gqa_untied", "--data_prefix=" + prefix,
               "--data_format=sft", "--samples=4"});
  ASSERT_NO_FATAL_FAILURE(ExpectFixtureFigures(result, fixture));
  const ToolResult too_many =
      RunEval({"--model=testdata/hf_parity/llama_gqa_untied", "--data_prefix=" + prefix,
               "--data_format=sft", "--samples=5"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_THAT(too_many.err, HasSubstr("holds 4 conversations; --samples=5"));
}

// --packed_sequence_size=32 packs the fixture's conversations (predicting 27, 7, 22 and 23
// tokens) as the trainer does, {0}, {1, 2}, {3}, two rows a pass: the same figures.
TEST(EvalToolTest, PackedConversationsGiveTheSameFigures) {
  const SftFixture fixture = ReadSftFixture();
  const std::string prefix = WriteConversations("eval_packed", fixture.conversations);
  const std::vector<std::string> common = {"--model=testdata/hf_parity/llama_gqa_untied",
                                           "--data_prefix=" + prefix, "--data_format=sft"};
  const ToolResult result =
      RunEval(With(common, {"--samples=4", "--packed_sequence_size=32", "--batch_size=2"}));
  ASSERT_NO_FATAL_FAILURE(ExpectFixtureFigures(result, fixture));
  // Conversation 1 shares its row with 2 whether or not 2 is evaluated: its figures do not
  // depend on its row's other conversations.
  const ToolResult first_two =
      RunEval(With(common, {"--samples=2", "--packed_sequence_size=32", "--batch_size=1"}));
  ASSERT_EQ(first_two.exit_code, 0) << first_two.err;
  EXPECT_EQ(first_two.lines[1]["loss"], result.lines[1]["loss"]);

  const ToolResult too_short = RunEval(With(common, {"--samples=4", "--packed_sequence_size=20"}));
  EXPECT_EQ(too_short.exit_code, 2);
  EXPECT_THAT(too_short.err, HasSubstr(": conversation 0 predicts 27 tokens, more than "
                                       "--packed_sequence_size=20"));
  const ToolResult windows =
      RunEval({"--model=testdata/hf_parity/llama_gqa_untied", "--data_prefix=" + prefix,
               "--sequence_length=8", "--samples=2", "--packed_sequence_size=32"});
  EXPECT_EQ(windows.exit_code, 2);
  EXPECT_THAT(windows.err, HasSubstr("--packed_sequence_size (32) packs conversations: allowed 0, "
                                     "or a positive size with --data_format=sft"));
  // Conversations are evaluated whole: a window length would be silently unused.
  const ToolResult length = RunEval(With(common, {"--samples=4", "--sequence_length=8"}));
  EXPECT_EQ(length.exit_code, 2);
  EXPECT_THAT(length.err, HasSubstr("--sequence_length (8) sizes windows; --data_format=sft "
                                    "evaluates each conversation whole; allowed with sft: unset"));
}

TEST(EvalToolTest, BadInputIsNamed) {
  const std::string model = "--model=testdata/hf_parity/llama_tied";
  const std::string prefix = WriteTokens("bad", {1, 2, 3, 4, 5, 6, 7, 200, 9, 10});
  // Byte-level data, as tools:preprocess records it (tokenizer_info.h), for a model whose
  // directory holds a tokenizer, as the Hub's do.
  const std::string bytes = WriteTokens("bytes", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const std::string with_tokenizer = keel::testing::NewTempDir("with_tokenizer");
  for (const char* file : {"config.json", "model.safetensors"}) {
    std::filesystem::copy(std::string("testdata/hf_parity/llama_tied/") + file,
                          with_tokenizer + "/" + file);
  }
  keel::testing::WriteFileOrFail(with_tokenizer + "/tokenizer_config.json", "{}");
  // A config.json whose hidden_size no model could have.
  const std::string huge = keel::testing::NewTempDir("huge");
  std::filesystem::copy("testdata/hf_parity/llama_tied/model.safetensors",
                        huge + "/model.safetensors");
  base::Json config =
      base::Json::parse(keel::testing::ReadFileOrFail("testdata/hf_parity/llama_tied/config.json"));
  config["hidden_size"] = int64_t{4611686018427387904};
  keel::testing::WriteFileOrFail(huge + "/config.json", config.dump());
  keel::testing::WriteFileOrFail(
      bytes + ".tokenizer.json",
      R"({"tokenizer_model": "bytes", "vocab_size": 256, "eos_id": 0, "append_eod": true,)"
      R"( "tokenizer_type": "bytes"})");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::vector<std::string> said;
  };
  const std::vector<Case> cases = {
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=3"},
       2,
       {"holds 10 tokens", "need 13", "at most 2 windows of 4"}},
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=4611686018427387904"},
       2,
       {"holds 10 tokens", "need 1.84467e+19", "at most 2 windows of 4"}},
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=2"},
       2,
       {"token 7 (window 1) is 200", "vocabulary of 131", "0 to 130"}},
      {{model, "--data_prefix=/nonexistent/tokens", "--sequence_length=4", "--samples=1"},
       2,
       {"--data_prefix names \"/nonexistent/tokens\", which is not an indexed dataset"}},
      {{"--model=" + with_tokenizer, "--data_prefix=" + bytes, "--sequence_length=4",
        "--samples=1"},
       2,
       {"holds byte values, not token ids", "hf_tokenize.py --model="}},
      {{"--model=/nonexistent/model", "--data_prefix=" + prefix, "--sequence_length=4",
        "--samples=1"},
       1,
       {"/nonexistent/model does not exist"}},
      {{"--data_prefix=" + prefix, "--sequence_length=4", "--samples=1"}, 2, {"--model"}},
      {{"--model=" + huge, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=1"},
       2,
       {huge + "/config.json: \"hidden_size\" is 4611686018427387904; it must be at most "
               "2147483647 (the largest size a model takes)"}},
      {{model, "--data_prefix=" + prefix, "--sequence_length=0", "--samples=1"},
       2,
       {"--sequence_length (0)", "must be positive"}},
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=1", "--dtype=int8"},
       2,
       {"--dtype=int8", "allowed: float32, bfloat16"}},
      // Devices LibTorch names but eval does not run on; the meta device once failed with
      // "incompatible tensor type" after the model was read.
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=1", "--device=meta"},
       2,
       {"--device=meta: allowed: cpu, cuda or cuda:N"}},
      {{model, "--data_prefix=" + prefix, "--sequence_length=4", "--samples=1", "--device=mps"},
       2,
       {"--device=mps: allowed: cpu, cuda or cuda:N"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.args, " "));
    const ToolResult result = RunEval(c.args);
    EXPECT_EQ(result.exit_code, c.exit_code) << result.err;
    EXPECT_TRUE(result.lines.empty());
    for (const std::string& said : c.said) EXPECT_THAT(result.err, HasSubstr(said));
  }
}

}  // namespace
}  // namespace keel::tools
