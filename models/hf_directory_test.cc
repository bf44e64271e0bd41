// A Hugging Face directory's config.json against its weights' headers: every fixture (made by
// transformers) agrees with itself; a config.json of another depth or other widths than its
// files is refused by name, before any model is built.
#include "models/hf_directory.h"

#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "base/files.h"
#include "base/json.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/hf_config.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::models {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr const char* kFixtures[] = {"llama_tied", "llama_gqa_untied", "llama_legacy_rope", "qwen2",
                                     "qwen3",      "mistral"};

TEST(HfDirectoryTest, EveryFixtureReadsAsItsConfigJson) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const std::string dir = std::string("testdata/hf_parity/") + name;
    KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions read, ReadHfDirectory(dir));
    KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions config, ReadHfConfig(dir));
    EXPECT_EQ(base::WriteJsonFields(read).dump(), base::WriteJsonFields(config).dump());
  }
}

// The fixture's tensors, those `keep` keeps, with the fixture's config.json patched.
std::string Corrupt(const std::string& name, bool (*keep)(const std::string&),
                    const std::string& patch) {
  const std::string dir = keel::testing::NewTempDir(name);
  const std::string from = "testdata/hf_parity/" + name;
  auto tensors = checkpoint::ReadSafetensorsFile(from + "/model.safetensors");
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (auto& [key, tensor] : *tensors) {
    if (keep(key)) kept.emplace_back(key, tensor);
  }
  EXPECT_TRUE(checkpoint::WriteSafetensorsFile(dir + "/model.safetensors", kept, {}).ok());
  auto config = base::ReadJsonFile(from + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  config->merge_patch(base::Json::parse(patch));
  EXPECT_TRUE(base::WriteJsonFile(dir + "/config.json", *config).ok());
  return dir;
}

TEST(HfDirectoryTest, AnotherDepthOrOtherWidthsAreNamed) {
  const auto all = [](const std::string&) { return true; };
  const auto one_layer = [](const std::string& key) {
    return !absl::StartsWith(key, "model.layers.1.");
  };
  EXPECT_THAT(ReadHfDirectory(Corrupt("llama_gqa_untied", one_layer, "{}")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"num_hidden_layers\" is 2, but the safetensors files hold 1 "
                                 "layers, numbered 0 to 0")));
  EXPECT_THAT(ReadHfDirectory(Corrupt("llama_gqa_untied", all, R"({"num_hidden_layers": 3})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"num_hidden_layers\" is 3, but the safetensors files hold 2")));
  EXPECT_THAT(
      ReadHfDirectory(Corrupt("llama_gqa_untied", all, R"({"intermediate_size": 1073741824})")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("\"model.layers.0.mlp.down_proj.weight\" is [64, 1073741824] by "
                         "config.json, [64, 96] in the files")));
  EXPECT_THAT(
      ReadHfDirectory(Corrupt("llama_gqa_untied", all, R"({"intermediate_size": 1099511627776})")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("\"intermediate_size\" is 1099511627776; it must be at most 2147483647")));
  EXPECT_THAT(ReadHfDirectory(Corrupt("llama_gqa_untied", all, R"({"vocab_size": 200})")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"model.embed_tokens.weight\" is [200, 64] by config.json, "
                                 "[131, 64] in the files")));
}

// A config.json whose text nlohmann parses only by throwing, or that would overflow the stack of
// whatever walked or printed it, is refused by path; each of these once ended the trainer
// (abort, then SIGSEGV). A value a message prints is cut (a megabyte once came out whole).
TEST(HfDirectoryTest, AConfigJsonBeyondWhatJsonCarriesIsRefusedNotACrash) {
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string text,
                            base::ReadFile("testdata/hf_parity/llama_tied/config.json"));
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  struct Case {
    std::string from, to, named;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  for (const Case& c : std::vector<Case>{
           {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e400",
            "number overflow parsing '1e400'"},
           {"\"hidden_size\": 64", "\"hidden_size\": " + deep, "nest deeper than 1000 levels"},
           {"\"hidden_size\": 64", "\"hidden_size\": \"" + std::string(1 << 20, 'x') + "\"",
            "\"hidden_size\" is \"" + std::string(199, 'x') + "..., not an integer",
            absl::StatusCode::kDataLoss}}) {
    SCOPED_TRACE(c.to.substr(0, 40));
    const std::string dir = keel::testing::NewTempDir("llama_tied");
    ASSERT_NE(text.find(c.from), std::string::npos);
    KEEL_ASSERT_OK(
        base::WriteFile(dir + "/config.json", absl::StrReplaceAll(text, {{c.from, c.to}})));
    const absl::Status status = ReadHfDirectory(dir).status();
    EXPECT_THAT(status, StatusIs(c.code, ::testing::AllOf(HasSubstr(dir + "/config.json"),
                                                          HasSubstr(c.named))));
    EXPECT_LT(status.message().size(), dir.size() + 300);
  }
}

}  // namespace
}  // namespace keel::models
