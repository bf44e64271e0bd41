#include "peft/module_matcher.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/tensor_parallel/layers.h"
#include "testing/status_matchers.h"
#include "torch/nn/modules/normalization.h"

namespace keel::peft {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two layers under Hugging Face's Llama names (hidden 8, MLP 16), a norm (not linear) and an
// untied lm_head (vocabulary 32).
struct TinyLlama : torch::nn::Module {
  TinyLlama() {
    auto model = register_module("model", std::make_shared<torch::nn::Module>());
    auto layers = model->register_module("layers", std::make_shared<torch::nn::Module>());
    for (const char* index : {"0", "1"}) {
      auto layer = layers->register_module(index, std::make_shared<torch::nn::Module>());
      auto attn = layer->register_module("self_attn", std::make_shared<torch::nn::Module>());
      for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
        attn->register_module(name, parallel::ColumnParallelLinear(8, 8, nullptr, false));
      }
      attn->register_module("o_proj", parallel::RowParallelLinear(8, 8, nullptr, false));
      auto mlp = layer->register_module("mlp", std::make_shared<torch::nn::Module>());
      mlp->register_module("gate_proj", parallel::ColumnParallelLinear(8, 16, nullptr, false));
      mlp->register_module("up_proj", parallel::ColumnParallelLinear(8, 16, nullptr, false));
      mlp->register_module("down_proj", parallel::RowParallelLinear(16, 8, nullptr, false));
      layer->register_module("input_layernorm",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    }
    register_module("lm_head", parallel::ColumnParallelLinear(8, 32, nullptr, false));
  }
};

std::vector<std::string> Names(const std::vector<LinearModule>& modules) {
  std::vector<std::string> names;
  for (const LinearModule& m : modules) names.push_back(m.name);
  return names;
}

absl::StatusOr<std::vector<std::string>> Select(const LoraOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::vector<LinearModule> modules,
                        SelectLinearModules(TinyLlama(), options));
  return Names(modules);
}

bool Match(absl::string_view pattern, absl::string_view name) {
  absl::StatusOr<bool> match = PatternMatches(pattern, name);
  EXPECT_THAT(match.status(), IsOk()) << pattern;
  return match.value_or(false);
}

// AutoModel's wildcard_match: '*' any characters (dots included), the whole name.
TEST(PatternMatchesTest, StarIsAnyCharactersAndTheWholeNameMustMatch) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  EXPECT_TRUE(Match("*_proj", q));
  EXPECT_TRUE(Match("*.layers.0.*.q_proj", q));
  EXPECT_FALSE(Match("*.layers.1.*.q_proj", q));
  EXPECT_FALSE(Match("q_proj", q));  // not a suffix rule
  EXPECT_TRUE(Match(q, q));
  EXPECT_TRUE(Match("*", q));
  EXPECT_TRUE(Match("*self_attn*", q));
  EXPECT_THAT(PatternMatches("model.layers.[", q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"model.layers.[\"")));
}

// With no selector: AutoModel's '*_proj', every projection and not lm_head, with each
// weight's [out, in].
TEST(SelectLinearModulesTest, TheDefaultIsEveryProjection) {
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<LinearModule> modules,
                            SelectLinearModules(TinyLlama(), LoraOptions()));
  ASSERT_EQ(modules.size(), 14u);
  EXPECT_EQ(modules[0].name, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(modules[6].name, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(modules[6].in_features, 16);
  EXPECT_EQ(modules[6].out_features, 8);
  EXPECT_EQ(AdapterParameters(modules[6], 4), 4 * 16 + 8 * 4);
  for (const LinearModule& m : modules) EXPECT_THAT(m.name, HasSubstr("_proj"));
}

TEST(SelectLinearModulesTest, TargetsExcludesAndAllLinear) {
  LoraOptions options;
  options.target_modules = {"*.q_proj", "model.layers.1.mlp.up_proj"};
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> targeted, Select(options));
  EXPECT_THAT(targeted,
              ElementsAre("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj",
                          "model.layers.1.mlp.up_proj"));
  options = LoraOptions();
  options.exclude_modules = {"*_proj"};
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> excluded, Select(options));
  EXPECT_THAT(excluded, ElementsAre("lm_head"));
  options = LoraOptions();
  options.match_all_linear = true;
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> all, Select(options));
  EXPECT_EQ(all.size(), 15u);  // the norms are no linear layers
  EXPECT_EQ(all.back(), "lm_head");
}

// A pattern that selects nothing is named, with names that exist.
TEST(SelectLinearModulesTest, APatternThatMatchesNothingIsNamed) {
  LoraOptions options;
  options.target_modules = {"*_proj", "q_proj"};
  EXPECT_THAT(Select(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("peft.target_modules pattern \"q_proj\" matches none of "
                                       "the model's 15 linear layers"),
                             HasSubstr("model.layers.0.self_attn.q_proj, "))));
  options = LoraOptions();
  options.exclude_modules = {"*.o_proj", "*input_layernorm"};  // a norm is no linear layer
  EXPECT_THAT(Select(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("peft.exclude_modules pattern \"*input_layernorm\"")));
}

TEST(CheckLoraOptionsTest, BadOptionsNameTheField) {
  const auto refused = [](const LoraOptions& options, const std::string& message) {
    EXPECT_THAT(CheckLoraOptions(options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  LoraOptions options;
  options.target_modules = {"*_proj"};
  options.exclude_modules = {"lm_head"};
  refused(options, "peft.target_modules ([\"*_proj\"]) and peft.exclude_modules");
  options.exclude_modules.clear();
  options.match_all_linear = true;
  refused(options, "peft.match_all_linear (true)");
  options = LoraOptions();
  options.target_modules = {""};
  refused(options, "holds an empty pattern");
  options = LoraOptions();
  options.dim = 0;
  refused(options, "peft.dim (0)");
  options = LoraOptions();
  options.alpha = 0;
  refused(options, "peft.alpha (0)");
  options = LoraOptions();
  options.dropout = 1;
  refused(options, "peft.dropout (1)");
  EXPECT_THAT(CheckLoraOptions(LoraOptions()), IsOk());
}

TEST(LoraOptionsTest, EnumsAreSpelledAsAutoModelSpellsThem) {
  DropoutPosition position;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("pre", &position, &error));
  EXPECT_EQ(position, DropoutPosition::kPre);
  EXPECT_FALSE(AbslParseFlag("before", &position, &error));
  EXPECT_THAT(error, HasSubstr("\"post\", \"pre\""));
  LoraAInit init;
  EXPECT_TRUE(AbslParseFlag("uniform", &init, &error));
  EXPECT_EQ(init, LoraAInit::kUniform);
  EXPECT_EQ(AbslUnparseFlag(LoraAInit::kXavier), "xavier");
}

}  // namespace
}  // namespace keel::peft
