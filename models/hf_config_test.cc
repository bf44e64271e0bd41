// config.json onto ModelOptions: every fixture's file, both RoPE spellings, each class's
// defaults, and a named refusal for what Keel does not build; and back: ModelOptions onto a
// config.json that gives the same options, and over a fixture's file, that file.
#include "models/hf_config.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::models {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

base::Json Llama() {
  return base::Json::parse(R"({
    "model_type": "llama", "vocab_size": 131, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8}})");
}

TEST(HfConfigTest, ReadsTheFixturesOfEveryFamily) {
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions gqa, ReadHfConfig("testdata/hf_parity/llama_gqa_untied"));
  EXPECT_EQ(gqa.family, ModelFamily::kLlama);
  EXPECT_EQ(gqa.vocab_size, 131);
  EXPECT_EQ(gqa.make_vocab_size_divisible_by, 1);
  EXPECT_EQ(gqa.hidden_size, 64);
  EXPECT_EQ(gqa.ffn_hidden_size, 96);
  EXPECT_EQ(gqa.num_layers, 2);
  EXPECT_EQ(gqa.num_attention_heads, 4);
  EXPECT_EQ(gqa.num_query_groups, 2);
  EXPECT_EQ(gqa.kv_channels, 24);
  EXPECT_EQ(gqa.rotary_base, 500000.0);
  EXPECT_EQ(gqa.rope_scaling_factor, 4.0);
  EXPECT_EQ(gqa.rope_original_max_position_embeddings, 8);
  EXPECT_EQ(gqa.norm_epsilon, 1e-5);
  EXPECT_TRUE(gqa.untie_embeddings_and_output_weights);
  // The transformers 4 spelling (rope_theta, rope_scaling) reads the same.
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions legacy,
                            ReadHfConfig("testdata/hf_parity/llama_legacy_rope"));
  EXPECT_EQ(legacy.rotary_base, 500000.0);
  EXPECT_EQ(legacy.rope_scaling_factor, 4.0);
  EXPECT_EQ(legacy.rope_original_max_position_embeddings, 8);
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions tied, ReadHfConfig("testdata/hf_parity/llama_tied"));
  EXPECT_FALSE(tied.untie_embeddings_and_output_weights);
  EXPECT_EQ(tied.rope_scaling_factor, 0.0);
  // Qwen2 has no head_dim key: hidden / heads.
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions qwen2, ReadHfConfig("testdata/hf_parity/qwen2"));
  EXPECT_EQ(qwen2.family, ModelFamily::kQwen2);
  EXPECT_EQ(qwen2.kv_channels, 16);
  EXPECT_EQ(qwen2.rotary_base, 1e6);
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions qwen3, ReadHfConfig("testdata/hf_parity/qwen3"));
  EXPECT_EQ(qwen3.family, ModelFamily::kQwen3);
  EXPECT_EQ(qwen3.kv_channels, 24);
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions mistral, ReadHfConfig("testdata/hf_parity/mistral"));
  EXPECT_EQ(mistral.family, ModelFamily::kMistral);
  EXPECT_EQ(mistral.window_size, 8);
}

TEST(HfConfigTest, DefaultsOfTheKeysAFileLeavesOut) {
  base::Json config = Llama();
  for (const char* key : {"num_key_value_heads", "head_dim", "tie_word_embeddings", "hidden_act",
                          "rope_parameters"}) {
    config.erase(key);
  }
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions options, HfConfigToOptions(config, "c"));
  EXPECT_EQ(options.num_query_groups, 4);
  EXPECT_EQ(options.kv_channels, 16);
  EXPECT_TRUE(options.untie_embeddings_and_output_weights);
  EXPECT_EQ(options.rotary_base, 10000.0);
  EXPECT_EQ(options.rope_scaling_factor, 0.0);
}

// Without original_max_position_embeddings, llama3 RoPE takes max_position_embeddings, and
// without that, the class's default (LlamaConfig's 2048, Qwen's 32768, Mistral's 131072), as
// transformers 5 does; Keel's own default (8192) once stood in silently.
TEST(HfConfigTest, Llama3WithoutItsOriginalLengthTakesTheMaximumPositions) {
  base::Json config = Llama();
  config["rope_parameters"].erase("original_max_position_embeddings");
  config["max_position_embeddings"] = 64;
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions options, HfConfigToOptions(config, "c"));
  EXPECT_EQ(options.rope_original_max_position_embeddings, 64);
  for (const auto& [family, positions] : std::map<std::string, int64_t>{
           {"llama", 2048}, {"qwen2", 32768}, {"qwen3", 32768}, {"mistral", 131072}}) {
    SCOPED_TRACE(family);
    config.erase("max_position_embeddings");
    config["model_type"] = family;
    KEEL_ASSERT_OK_AND_ASSIGN(options, HfConfigToOptions(config, "c"));
    EXPECT_EQ(options.rope_original_max_position_embeddings, positions);
  }
}

// Without head_dim or sliding_window, each family's transformers class default: Qwen3's
// head_dim is 128, the others' hidden_size // num_attention_heads; Mistral's window is 4096
// when the key is absent, none when it is null.
TEST(HfConfigTest, EachFamilysClassDefaults) {
  base::Json qwen3 = Llama();
  qwen3.erase("head_dim");
  qwen3["model_type"] = "qwen3";
  qwen3["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions options, HfConfigToOptions(qwen3, "c"));
  EXPECT_EQ(options.kv_channels, 128);
  base::Json mistral = qwen3;
  mistral["model_type"] = "mistral";
  KEEL_ASSERT_OK_AND_ASSIGN(options, HfConfigToOptions(mistral, "c"));
  EXPECT_EQ(options.kv_channels, 16);
  EXPECT_EQ(options.window_size, 4096);
  mistral["sliding_window"] = nullptr;
  KEEL_ASSERT_OK_AND_ASSIGN(options, HfConfigToOptions(mistral, "c"));
  EXPECT_EQ(options.window_size, 0);
}

TEST(HfConfigTest, RefusesWhatKeelDoesNotBuildByName) {
  struct Case {
    std::string patch;  // merged into Llama()
    std::string named;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"model_type": "gemma"})", "\"model_type\" is \"gemma\""},
           {R"({"model_type": "gpt"})", "\"model_type\" is \"gpt\""},
           {R"({"hidden_act": "gelu"})", "\"hidden_act\" is \"gelu\""},
           {R"({"attention_bias": true})", "\"attention_bias\" is true"},
           {R"({"mlp_bias": true})", "\"mlp_bias\" is true"},
           {R"({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}})",
            "\"rope_parameters.rope_type\" is \"yarn\""},
           {R"({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                "partial_rotary_factor": 0.5}})",
            "\"partial_rotary_factor\" is 0.5"},
           {R"({"rope_theta": 20000.0})", "\"rope_theta\" is 20000 but rope_parameters' is 500000"},
           {R"({"num_key_value_heads": 3})", "\"num_key_value_heads\" is 3, which does not divide"},
           {R"({"hidden_size": 0})", "\"hidden_size\" is 0; it must be positive"},
           {R"({"vocab_size": 4611686018427387904})",
            "\"vocab_size\" is 4611686018427387904; it must be at most 2147483647"},
           // Past int64_t: once read as -1 and refused as "-1; it must be positive".
           {R"({"vocab_size": 18446744073709551615})",
            "\"vocab_size\" is 18446744073709551615; it must be at most 2147483647"},
           {R"({"model_type": "qwen2", "use_sliding_window": true})",
            "\"use_sliding_window\" is true"},
           // More heads than hidden units and no head_dim: a head of width 0.
           {R"({"num_attention_heads": 192, "num_key_value_heads": 192, "head_dim": null})",
            "\"head_dim\" is missing, and hidden_size (64) // num_attention_heads (192) is 0"},
           {R"({"rms_norm_eps": -1})", "\"rms_norm_eps\" is -1; it must be a positive finite"},
           {R"({"rope_parameters": {"rope_type": "default", "rope_theta": 0}})",
            "\"rope_theta\" is 0; it must be a positive finite"},
           // Checked before the conversion to int64 (1e30 once became -2^63).
           {R"({"rope_parameters": {"original_max_position_embeddings": 1e30}})",
            "original_max_position_embeddings 1e+30; llama3 needs"},
           {R"({"rope_parameters": {"original_max_position_embeddings": 8.5}})",
            "original_max_position_embeddings 8.5; llama3 needs"},
           {R"({"rope_parameters": {"low_freq_factor": 0}})", "low_freq_factor 0, "},
           {R"({"rope_parameters": {"factor": -4}})", "has factor -4, "}}) {
    SCOPED_TRACE(c.patch);
    base::Json config = Llama();
    config.merge_patch(base::Json::parse(c.patch));
    EXPECT_THAT(HfConfigToOptions(config, "dir/config.json"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("dir/config.json"), HasSubstr(c.named))));
  }
  // llama3's factors are required (transformers refuses a file without one, or with null).
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
    SCOPED_TRACE(key);
    base::Json config = Llama();
    config["rope_parameters"].erase(key);
    EXPECT_THAT(HfConfigToOptions(config, "c"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("\"rope_parameters.", key,
                                                "\" is missing; llama3 RoPE needs it"))));
    config["rope_parameters"][key] = nullptr;
    EXPECT_THAT(HfConfigToOptions(config, "c"),
                StatusIs(absl::StatusCode::kDataLoss,
                         HasSubstr(absl::StrCat("\"", key, "\" is null, not a number"))));
  }
  // null is no number where transformers computes with one (rms_norm_eps, rope_theta), but is
  // 1.0 for partial_rotary_factor, as there.
  base::Json null_eps = Llama();
  null_eps["rms_norm_eps"] = nullptr;
  EXPECT_THAT(HfConfigToOptions(null_eps, "c"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"rms_norm_eps\" is null")));
  base::Json null_theta = Llama();
  null_theta["rope_parameters"]["rope_theta"] = nullptr;
  EXPECT_THAT(HfConfigToOptions(null_theta, "c"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"rope_theta\" is null")));
  base::Json null_partial = Llama();
  null_partial["partial_rotary_factor"] = nullptr;
  null_partial["rope_parameters"]["partial_rotary_factor"] = nullptr;
  KEEL_EXPECT_OK(HfConfigToOptions(null_partial, "c"));
  base::Json mistyped = Llama();
  mistyped["vocab_size"] = "131";
  EXPECT_THAT(HfConfigToOptions(mistyped, "c"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\"vocab_size\" is \"131\"")));
  EXPECT_THAT(ReadHfConfig("/nonexistent"), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

constexpr const char* kFixtures[] = {"llama_tied", "llama_gqa_untied", "llama_legacy_rope", "qwen2",
                                     "qwen3",      "mistral"};

TEST(HfConfigTest, WrittenConfigReadsBackAsTheSameOptions) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions options,
                              ReadHfConfig(std::string("testdata/hf_parity/") + name));
    KEEL_ASSERT_OK_AND_ASSIGN(const base::Json written,
                              OptionsToHfConfig(options, "bfloat16", base::Json::object()));
    EXPECT_EQ(written["dtype"], "bfloat16");
    EXPECT_EQ(written["max_position_embeddings"], options.max_sequence_length);
    KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions again, HfConfigToOptions(written, "written"));
    EXPECT_EQ(base::WriteJsonFields(again).dump(), base::WriteJsonFields(options).dump());
  }
}

TEST(HfConfigTest, WrittenOverTheFileItWasReadFromIsThatFile) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    const std::string directory = std::string("testdata/hf_parity/") + name;
    KEEL_ASSERT_OK_AND_ASSIGN(const base::Json file,
                              base::ReadJsonFile(directory + "/config.json"));
    KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions options, ReadHfConfig(directory));
    KEEL_ASSERT_OK_AND_ASSIGN(const base::Json written,
                              OptionsToHfConfig(options, "float32", file));
    if (file.contains("rope_parameters")) {
      // Key order aside (ordered_json compares it): the same keys and values.
      EXPECT_EQ(nlohmann::json::parse(written.dump()), nlohmann::json::parse(file.dump()));
    } else {  // transformers 4's rope_theta and rope_scaling become rope_parameters
      EXPECT_FALSE(written.contains("rope_theta"));
      EXPECT_FALSE(written.contains("rope_scaling"));
      EXPECT_EQ(written["rope_parameters"]["rope_type"], "llama3");
      KEEL_ASSERT_OK_AND_ASSIGN(const ModelOptions again, HfConfigToOptions(written, "written"));
      EXPECT_EQ(base::WriteJsonFields(again).dump(), base::WriteJsonFields(options).dump());
    }
  }
}

TEST(HfConfigTest, ConfigOfAnotherDepthDropsTheBasesLayerTypes) {
  KEEL_ASSERT_OK_AND_ASSIGN(const base::Json file,
                            base::ReadJsonFile("testdata/hf_parity/qwen2/config.json"));
  KEEL_ASSERT_OK_AND_ASSIGN(ModelOptions options, ReadHfConfig("testdata/hf_parity/qwen2"));
  options.num_layers = 3;
  KEEL_ASSERT_OK_AND_ASSIGN(const base::Json written, OptionsToHfConfig(options, "float32", file));
  EXPECT_EQ(written["num_hidden_layers"], 3);
  EXPECT_FALSE(written.contains("layer_types"));
  EXPECT_FALSE(written.contains("head_dim"));  // Qwen2's class has none
}

TEST(HfConfigTest, TheGptAndExpertsHaveNoConfigJson) {
  ModelOptions gpt;
  EXPECT_THAT(OptionsToHfConfig(gpt, "float32", base::Json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.family gpt")));
  ModelOptions moe;
  moe.family = ModelFamily::kLlama;
  moe.num_moe_experts = 4;
  EXPECT_THAT(OptionsToHfConfig(moe, "float32", base::Json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("with 4 experts")));
}

TEST(HfConfigTest, VocabRowsAreTheEmbeddingAndAnUntiedHead) {
  ModelOptions options;
  options.family = ModelFamily::kLlama;
  options.vocab_size = 131;
  EXPECT_EQ(HfVocabRows(options), (std::map<std::string, int64_t>{{kHfEmbeddingWeight, 131}}));
  options.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(HfVocabRows(options),
            (std::map<std::string, int64_t>{{kHfEmbeddingWeight, 131}, {kHfOutputWeight, 131}}));
}

}  // namespace
}  // namespace keel::models
