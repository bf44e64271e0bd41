// Runs tools/scripts/hf_sft_tokenize.py with the tiny chat tokenizer of
// testdata/hf_parity/llama_gqa_untied_sft and reads what it wrote with
// //sampling:conversation_dataset. The expected tokens and masks are transformers' own
// (apply_chat_template(return_assistant_tokens_mask=True), recorded by
// tools/scripts/hf_parity.py), not the script's: the {% generation %} template must give them,
// and so must the same template without the blocks (the renders of message prefixes), the
// ShareGPT spelling and the prompt/completion columns of the same conversations.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/conversation_dataset.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/cli/subprocess_testutil.h"

ABSL_FLAG(std::string, python, "", "The Python of Keel's LibTorch (@libtorch//:python).");
ABSL_FLAG(std::string, script, "", "Path of tools/scripts/hf_sft_tokenize.py.");

namespace keel::tools {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kFixture[] = "testdata/hf_parity/llama_gqa_untied_sft";

struct ScriptResult {
  int exit_code;
  std::string out;
  std::string err;
};

ScriptResult RunScript(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {absl::GetFlag(FLAGS_python), absl::GetFlag(FLAGS_script)};
  argv.insert(argv.end(), args.begin(), args.end());
  cli::SubprocessOptions options;
  options.stderr_path = keel::testing::NewTempDir("sft_stderr") + "/stderr";
  options.pipe_stdout = true;
  options.add_environment = {"HF_HUB_OFFLINE=1"};
  cli::Subprocess child = cli::Subprocess::Start(argv, options);
  const std::string out = child.DrainStdout();
  return {child.Wait(), out, child.Stderr()};
}

std::map<std::string, at::Tensor> Expected() {
  std::map<std::string, at::Tensor> tensors;
  auto read = checkpoint::ReadSafetensorsFile(absl::StrCat(kFixture, "/expected.safetensors"));
  EXPECT_TRUE(read.ok()) << read.status();
  if (read.ok()) {
    for (auto& [name, tensor] : *read) tensors[name] = tensor;
  }
  return tensors;
}

std::string WriteRows(const std::string& name, const std::string& rows) {
  const std::string path = keel::testing::NewTempDir(name) + "/rows.jsonl";
  keel::testing::WriteFileOrFail(path, rows);
  return path;
}

// Conversation `index` of the dataset at `prefix` equals recorded conversation `recorded`.
void ExpectRecordedConversation(const sampling::ConversationDataset& chats, int64_t index,
                                int64_t recorded) {
  SCOPED_TRACE(absl::StrCat("conversation ", index, " against recorded ", recorded));
  static const std::map<std::string, at::Tensor>* const expected =
      new std::map<std::string, at::Tensor>(Expected());
  const int64_t length = expected->at("lengths")[recorded].item<int64_t>();
  KEEL_ASSERT_OK_AND_ASSIGN(sampling::Conversation c, chats.Get(index));
  EXPECT_TRUE(at::equal(c.tokens, expected->at("input_ids")[recorded].slice(0, 0, length)))
      << c.tokens;
  EXPECT_TRUE(at::equal(c.loss_mask.to(at::kLong),
                        expected->at("assistant_masks")[recorded].slice(0, 0, length)))
      << c.loss_mask;
}

class HfSftTokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = keel::testing::WhyNotExecutable(absl::GetFlag(FLAGS_python))) {
      GTEST_SKIP() << *why;
    }
  }
  // Runs the script with `args` and the model fixture, writing a fresh prefix; its path.
  std::string Tokenize(const std::vector<std::string>& args, const std::string& model = kFixture) {
    const std::string prefix = keel::testing::NewTempDir("sft") + "/chat";
    std::vector<std::string> all = {"--model=" + model, "--output_prefix=" + prefix};
    all.insert(all.end(), args.begin(), args.end());
    const ScriptResult result = RunScript(all);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return prefix;
  }
};

TEST_F(HfSftTokenizeTest, MasksAreTransformersAssistantMasks) {
  const std::string prefix = Tokenize({absl::StrCat(kFixture, "/conversations.jsonl")});
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, sampling::ConversationDataset::Open(prefix));
  ASSERT_EQ(chats.size(), 4);
  for (int64_t i = 0; i < 4; ++i) ExpectRecordedConversation(chats, i, i);
  // Every learned token but none at position 0 is a learned label after the shift.
  EXPECT_EQ(chats.num_learned_tokens(), Expected().at("label_tokens").sum().item<int64_t>());
  EXPECT_THAT(
      keel::testing::ReadFileOrFail(prefix + ".tokenizer.json"),
      AllOf(HasSubstr("\"vocab_size\": 38"), HasSubstr("\"tokenizer_type\": \"huggingface\"")));
}

TEST_F(HfSftTokenizeTest, PrefixRendersGiveTheSameMasksWithoutGenerationBlocks) {
  const std::string prefix =
      Tokenize({absl::StrCat("--chat_template=", kFixture, "/prefix_template.jinja"),
                absl::StrCat(kFixture, "/conversations.jsonl")});
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, sampling::ConversationDataset::Open(prefix));
  ASSERT_EQ(chats.size(), 4);
  for (int64_t i = 0; i < 4; ++i) ExpectRecordedConversation(chats, i, i);
}

TEST_F(HfSftTokenizeTest, RefusesATemplateThatRewritesEarlierTurns) {
  // Qwen3-like: the <think> of conversation 4's first answer is dropped once a user follows.
  const std::string template_flag =
      absl::StrCat("--chat_template=", kFixture, "/rewriting_template.jinja");
  for (bool skip_invalid : {false, true}) {
    SCOPED_TRACE(skip_invalid ? "--skip_invalid" : "");
    const std::string prefix = keel::testing::NewTempDir("rewrite") + "/chat";
    std::vector<std::string> args = {absl::StrCat("--model=", kFixture),
                                     "--output_prefix=" + prefix, template_flag,
                                     absl::StrCat(kFixture, "/conversations.jsonl")};
    if (skip_invalid) args.push_back("--skip_invalid");
    const ScriptResult result = RunScript(args);
    EXPECT_EQ(result.exit_code, 1) << result.err;
    EXPECT_THAT(result.err, AllOf(HasSubstr(template_flag), HasSubstr("conversations.jsonl:4"),
                                  HasSubstr("rewrites earlier turns")));
    EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
    EXPECT_FALSE(std::filesystem::exists(prefix + "_loss_mask.idx"));
  }
}

TEST_F(HfSftTokenizeTest, ShareGptRowsAreTheirMessages) {
  const std::string rows = WriteRows(
      "sharegpt",
      R"({"conversations": [{"from": "system", "value": "You are terse."}, {"from": "human", "value": "What is two plus two?"}, {"from": "gpt", "value": "Four."}, {"from": "human", "value": "And three plus three?"}, {"from": "gpt", "value": "Six."}]}
{"conversations": [{"from": "human", "value": "Say hi"}, {"from": "gpt", "value": "Hi!"}]}
)");
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, sampling::ConversationDataset::Open(Tokenize({rows})));
  ASSERT_EQ(chats.size(), 2);
  ExpectRecordedConversation(chats, 0, 0);
  ExpectRecordedConversation(chats, 1, 1);
}

TEST_F(HfSftTokenizeTest, ColumnsAreSystemUserAssistantWithATemplate) {
  // AutoModel's ColumnMappedTextInstructionDataset: context, question, answer.
  const std::string rows = WriteRows(
      "columns",
      R"({"ctx": "The cat sat on the mat.", "q": "Where did the cat sit?", "a": "On the mat.", "other": 1}
)");
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto chats, sampling::ConversationDataset::Open(
                      Tokenize({"--column_mapping=context=ctx,question=q,answer=a", rows})));
  ASSERT_EQ(chats.size(), 1);
  ExpectRecordedConversation(chats, 0, 2);
}

TEST_F(HfSftTokenizeTest, ColumnsArePromptAndCompletionWithoutATemplate) {
  // The tokenizer alone, without chat_template.jinja: AutoModel's plain format.
  const std::string model = keel::testing::NewTempDir("no_template");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy(absl::StrCat(kFixture, "/", file), model + "/" + file);
  }
  const std::string rows = WriteRows(
      "plain",
      R"({"ctx": "The cat sat on the mat.", "q": "Where did the cat sit?", "a": "On the mat."}
)");
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto chats, sampling::ConversationDataset::Open(
                      Tokenize({"--column_mapping=context=ctx,question=q,answer=a", rows}, model)));
  ASSERT_EQ(chats.size(), 1);
  KEEL_ASSERT_OK_AND_ASSIGN(sampling::Conversation c, chats.Get(0));
  const std::map<std::string, at::Tensor> expected = Expected();
  const at::Tensor ids = expected.at("prompt_completion_ids");
  const int64_t prompt = expected.at("prompt_completion_prompt_tokens").item<int64_t>();
  EXPECT_TRUE(at::equal(c.tokens, ids)) << c.tokens;
  at::Tensor mask = at::ones_like(ids);
  mask.slice(0, 0, prompt).zero_();
  EXPECT_TRUE(at::equal(c.loss_mask.to(at::kLong), mask)) << c.loss_mask;

  const ScriptResult messages = RunScript({"--model=" + model, "--output_prefix=" + model + "/x",
                                           absl::StrCat(kFixture, "/conversations.jsonl")});
  EXPECT_EQ(messages.exit_code, 2);
  EXPECT_THAT(messages.err, AllOf(HasSubstr(model), HasSubstr("no chat template"),
                                  HasSubstr("--chat_template=FILE")));
}

TEST_F(HfSftTokenizeTest, TrainOnAllLearnsEveryToken) {
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto chats, sampling::ConversationDataset::Open(Tokenize(
                      {"--train_on_all", absl::StrCat(kFixture, "/conversations.jsonl")})));
  EXPECT_EQ(chats.num_learned_tokens(), chats.num_tokens());
}

TEST_F(HfSftTokenizeTest, BadRowsAreNamedOrSkippedAndCounted) {
  const std::string rows = WriteRows(
      "bad",
      R"({"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]}
not json
{"messages": []}
{"messages": [{"role": "narrator", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]}
{"messages": [{"role": "user", "content": "Say hi"}]}

{"conversations": [{"from": "human", "value": "Say hi"}, {"from": "bot", "value": "Hi!"}]}
{"text": "Say hi"}
[1, 2]
{"messages": [{"role": "user", "content": ["Say hi"]}, {"role": "assistant", "content": "Hi!"}]}
)");
  const std::string prefix = keel::testing::NewTempDir("bad") + "/chat";
  const std::vector<std::string> args = {absl::StrCat("--model=", kFixture),
                                         "--output_prefix=" + prefix, rows};
  const ScriptResult refused = RunScript(args);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, AllOf(HasSubstr(rows + ":2: not JSON"), HasSubstr("--skip_invalid")));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));

  std::vector<std::string> skip = args;
  skip.push_back("--skip_invalid");
  const ScriptResult skipped = RunScript(skip);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_THAT(skipped.out,
              AllOf(HasSubstr("1 conversations"), HasSubstr("9 invalid rows skipped")));
  for (const char* named :
       {":2: not JSON", ":3: no messages", ":4: message 0: unknown role 'narrator'",
        ":5: no assistant turn", ":6: an empty line", ":7: message 1: unknown from 'bot'",
        ":8: no 'messages' (OpenAI) or 'conversations' (ShareGPT)", ":9: not a JSON object",
        ":10: message 0 has no string 'role' and 'content'"}) {
    EXPECT_THAT(skipped.err, HasSubstr(absl::StrCat("skipped ", rows, named)));
  }
  EXPECT_THAT(skipped.err, Not(HasSubstr(rows + ":1:")));
  KEEL_ASSERT_OK_AND_ASSIGN(auto chats, sampling::ConversationDataset::Open(prefix));
  ExpectRecordedConversation(chats, 0, 1);
}

TEST_F(HfSftTokenizeTest, BadUsageIsNamed) {
  for (const char* mapping : {"--column_mapping=answer=a", "--column_mapping=prompt=p,answer=a",
                              "--column_mapping=question=q,question=r,answer=a"}) {
    SCOPED_TRACE(mapping);
    const ScriptResult result =
        RunScript({absl::StrCat("--model=", kFixture), "--output_prefix=/nonexistent/x", mapping,
                   absl::StrCat(kFixture, "/conversations.jsonl")});
    EXPECT_EQ(result.exit_code, 2);
    EXPECT_THAT(result.err, HasSubstr(mapping));
  }
  const ScriptResult no_model = RunScript({"--model=/nonexistent", "--output_prefix=/tmp/x", "f"});
  EXPECT_EQ(no_model.exit_code, 2);
  EXPECT_THAT(no_model.err, HasSubstr("--model=/nonexistent: no such directory"));
}

}  // namespace
}  // namespace keel::tools
