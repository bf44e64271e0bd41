#include "sampling/gpt_dataset_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::Pair;

GptDatasetConfig Valid() {
  GptDatasetConfig config;
  config.random_seed = 1234;
  config.sequence_length = 16;
  config.blend = Blend{{"a", "b"}, std::vector<double>{0.3, 0.7}};
  config.split = "969,30,1";
  config.reset_position_ids = false;
  config.reset_attention_mask = false;
  config.eod_mask_loss = false;
  return config;
}

TEST(GptDatasetConfigTest, SplitStringsParseAsMegatronsWithinTheStrictForm) {
  // 969 + 30 + 1 = 1000.
  EXPECT_THAT(*ParseAndNormalizeSplit("969,30,1"),
              ElementsAre(DoubleEq(0.969), DoubleEq(0.03), DoubleEq(0.001)));
  EXPECT_THAT(*ParseAndNormalizeSplit("70 20 10"), ElementsAre(0.7, 0.2, 0.1));
  EXPECT_THAT(*ParseAndNormalizeSplit("0.99, 0.01"), ElementsAre(0.99, 0.01, 0.0));
  EXPECT_THAT(*ParseAndNormalizeSplit("1"), ElementsAre(1.0, 0.0, 0.0));
  // Any other separator, as upstream's regular expression reads them.
  for (const char* separated : {"8/1/1", "8:1:1", "8 | 1 | 1", "8;1;1", "8_1_1"}) {
    SCOPED_TRACE(separated);
    EXPECT_THAT(*ParseAndNormalizeSplit(separated), ElementsAre(0.8, 0.1, 0.1));
  }
  for (const char* bad : {"-1,2,1", "1e2,1", "train,valid", "1.2.3", "1,2,3,4", "0,0,0", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(
        ParseAndNormalizeSplit(bad),
        StatusIs(StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("split \"", bad, "\""))));
  }
}

TEST(GptDatasetConfigTest, SplitMatrixSumsBookendsInOrder) {
  // [0.9, 0.05, 0.05] -> bookends 0, 0.9, 0.9 + 0.05, 0.9 + 0.05 + 0.05 (Python's floats).
  const SplitMatrix matrix = ConvertSplitVectorToSplitMatrix({0.9, 0.05, 0.05});
  EXPECT_THAT(matrix[0], Optional(Pair(0.0, 0.9)));
  EXPECT_THAT(matrix[1], Optional(Pair(0.9, 0.9 + 0.05)));
  EXPECT_THAT(matrix[2], Optional(Pair(0.9 + 0.05, 0.9 + 0.05 + 0.05)));
  // An empty share gets no split.
  const SplitMatrix one = ConvertSplitVectorToSplitMatrix({0.0, 1.0, 0.0});
  EXPECT_FALSE(one[0].has_value());
  EXPECT_THAT(one[1], Optional(Pair(0.0, 1.0)));
  EXPECT_FALSE(one[2].has_value());
}

TEST(GptDatasetConfigTest, NormalizeSumsPairwiseAsNumpy) {
  // numpy.sum([0.1] * 10) == 1.0 (pairwise: eight accumulators, then two more), whereas
  // adding in order gives 0.9999999999999999; so numpy's normalize leaves 0.1 as is.
  const std::vector<double> tenths(10, 0.1);
  EXPECT_THAT(Normalize(tenths), ::testing::Each(0.1));
  // [3, 7] -> [0.3, 0.7], as Megatron normalizes integer weights.
  EXPECT_THAT(Normalize({3, 7}), ElementsAre(0.3, 0.7));
}

TEST(GptDatasetConfigTest, BlendListsAreMegatronsDataPath) {
  KEEL_ASSERT_OK_AND_ASSIGN(Blend weighted, GetBlendFromList({"0.3", " /x/a ", "70", "/x/b"}));
  EXPECT_THAT(weighted.prefixes, ElementsAre("/x/a", "/x/b"));
  EXPECT_THAT(weighted.weights, Optional(ElementsAre(0.3, 70.0)));
  KEEL_ASSERT_OK_AND_ASSIGN(Blend plain, GetBlendFromList({"/x/a", "/x/b"}));
  EXPECT_THAT(plain.prefixes, ElementsAre("/x/a", "/x/b"));
  EXPECT_FALSE(plain.weights.has_value());
  EXPECT_THAT(GetBlendFromList({}), StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(GetBlendFromList({"0.3", "/x/a", "/x/b", "/x/c"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mixes weights and prefixes")));
  EXPECT_THAT(GetBlendFromList({"0.3", "/x/a", "0.7"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mixes weights and prefixes")));
}

TEST(GptDatasetConfigTest, ValidConfigGivesItsSplitMatrix) {
  KEEL_ASSERT_OK_AND_ASSIGN(std::optional<SplitMatrix> matrix, ValidateGptDatasetConfig(Valid()));
  ASSERT_TRUE(matrix.has_value());
  EXPECT_THAT((*matrix)[2], Optional(Pair(DoubleEq(0.999), DoubleEq(1.0))));
  GptDatasetConfig per_split = Valid();
  per_split.blend.reset();
  per_split.split.reset();
  per_split.blend_per_split = {{Blend{{"a"}, std::nullopt}, std::nullopt, std::nullopt}};
  KEEL_ASSERT_OK_AND_ASSIGN(matrix, ValidateGptDatasetConfig(per_split));
  EXPECT_FALSE(matrix.has_value());
}

TEST(GptDatasetConfigTest, EveryRuleIsChecked) {
  struct Case {
    const char* name;
    void (*change)(GptDatasetConfig&);
    const char* message;
  };
  const Case cases[] = {
      {"blend with blend_per_split",
       [](GptDatasetConfig& c) {
         c.blend_per_split = {{Blend{{"a"}, {}}, {}, {}}};
       },
       "blend and blend_per_split are incompatible"},
      {"split with blend_per_split",
       [](GptDatasetConfig& c) {
         c.blend.reset();
         c.blend_per_split = {{Blend{{"a"}, {}}, {}, {}}};
       },
       "split (\"969,30,1\") and blend_per_split are incompatible"},
      {"two blends per split",
       [](GptDatasetConfig& c) {
         c.blend.reset();
         c.split.reset();
         c.blend_per_split = {{Blend{{"a"}, {}}, {}}};
       },
       "blend_per_split holds 2 blends"},
      {"per-split weights",
       [](GptDatasetConfig& c) {
         c.blend.reset();
         c.split.reset();
         c.blend_per_split = {{{}, Blend{{"a", "b"}, {{1.0}}}, {}}};
       },
       "blend_per_split valid: prefixes and weights must be equal in number"},
      {"weights", [](GptDatasetConfig& c) { c.blend->weights = {{0.5}}; },
       "prefixes and weights must be equal in number (2 prefixes, 1 weights)"},
      {"no blend", [](GptDatasetConfig& c) { c.blend.reset(); }, "Keel has no mock datasets"},
      {"no prefix", [](GptDatasetConfig& c) { c.blend = Blend{}; }, "blend holds 0 prefixes"},
      {"no split", [](GptDatasetConfig& c) { c.split.reset(); }, "split must be provided"},
      {"bad split", [](GptDatasetConfig& c) { c.split = "a,b"; }, "split \"a,b\" holds 'a'"},
      {"zero weight",
       [](GptDatasetConfig& c) {
         c.blend->weights = {{0.0, 1.0}};
       },
       "the weight of a (0) must be finite and > 0"},
      {"nan weight",
       [](GptDatasetConfig& c) {
         c.blend->weights = {{1.0, NAN}};
       },
       "the weight of b (nan)"},
      {"unset reset_position_ids", [](GptDatasetConfig& c) { c.reset_position_ids.reset(); },
       "reset_position_ids must be set"},
      {"unset reset_attention_mask", [](GptDatasetConfig& c) { c.reset_attention_mask.reset(); },
       "reset_attention_mask must be set"},
      {"unset eod_mask_loss", [](GptDatasetConfig& c) { c.eod_mask_loss.reset(); },
       "eod_mask_loss must be set"},
      {"reset_position_ids", [](GptDatasetConfig& c) { c.reset_position_ids = true; },
       "carry no position ids or attention mask"},
      {"reset_attention_mask", [](GptDatasetConfig& c) { c.reset_attention_mask = true; },
       "carry no position ids or attention mask"},
      {"sequence_length", [](GptDatasetConfig& c) { c.sequence_length = 1; },
       "sequence_length (1) must be > 1"},
      {"surplus", [](GptDatasetConfig& c) { c.mid_level_dataset_surplus = -0.5; },
       "mid_level_dataset_surplus (-0.5) must be finite and >= 0"},
      {"seed", [](GptDatasetConfig& c) { c.random_seed = -1; }, "random seed -1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GptDatasetConfig config = Valid();
    c.change(config);
    EXPECT_THAT(ValidateGptDatasetConfig(config),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(GptDatasetConfigTest, ReadsAndWritesTheGoldenJsonForm) {
  GptDatasetConfig config;
  KEEL_ASSERT_OK(base::ReadJsonFields(base::Json::parse(R"({"blend": [["a", "b"], [3, 7]],
                            "blend_per_split": [[["c"], null], null, null],
                            "tokenizer": {"vocab_size": 40, "eod": 39, "pad": null}})"),
                                      config));
  ASSERT_TRUE(config.blend.has_value());
  EXPECT_THAT(config.blend->weights, Optional(ElementsAre(3.0, 7.0)));
  ASSERT_TRUE(config.blend_per_split.has_value());
  EXPECT_THAT((*config.blend_per_split)[0]->prefixes, ElementsAre("c"));
  EXPECT_EQ(config.tokenizer.eod, 39);
  EXPECT_FALSE(config.tokenizer.pad.has_value());
  const base::Json written = base::WriteJsonFields(config);
  EXPECT_EQ(written["blend"].dump(), R"([["a","b"],[3.0,7.0]])");
  EXPECT_THAT(base::ReadJsonFields(base::Json::parse(R"({"blend": ["a"]})"), config),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("blend must be [prefixes")));
}

}  // namespace
}  // namespace keel::sampling
