#include "tools/recipe/gpt.h"

#include <string>

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "torch/utils.h"

namespace keel::tools::recipe {
namespace {

GptOptions Small() {
  GptOptions options;
  options.hidden_size = 32;
  options.num_layers = 2;
  options.num_attention_heads = 4;
  options.ffn_hidden_size = 64;
  options.max_sequence_length = 16;
  return options;
}

TEST(GptTest, LmHeadIsTheInputEmbeddingItself) {
  torch::manual_seed(0);
  Gpt model(Small());
  const auto parameters = model->named_parameters();
  ASSERT_TRUE(parameters.contains("lm_head.weight"));
  ASSERT_TRUE(parameters.contains("wte.weight"));
  EXPECT_TRUE(parameters["lm_head.weight"].is_same(parameters["wte.weight"]));
  // An update through one name is seen through the other: one tensor, not a copy.
  at::NoGradGuard no_grad;
  parameters["wte.weight"].add_(1.0);
  EXPECT_TRUE(at::equal(model->lm_head_weight(), parameters["wte.weight"]));
}

TEST(GptTest, LogitsHaveTheVocabularyAndDependOnlyOnEarlierTokens) {
  torch::manual_seed(0);
  Gpt model(Small());
  const at::Tensor tokens = at::randint(256, {2, 12}, at::kLong);
  const at::Tensor logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, 12, 256}));
  // Changing token 7 leaves positions 0..6 exactly as they were, and changes position 7.
  at::Tensor changed = tokens.clone();
  changed.index_put_({at::indexing::Slice(), 7}, (tokens.select(1, 7) + 1) % 256);
  const at::Tensor other = model->forward(changed);
  EXPECT_TRUE(at::equal(other.slice(1, 0, 7), logits.slice(1, 0, 7)));
  EXPECT_FALSE(at::allclose(other.select(1, 7), logits.select(1, 7)));
}

// GPT-2's initialisation: embeddings and projection weights N(0, 0.02), LayerNorms at (1, 0),
// biases at 0.
TEST(GptTest, InitialisesLikeGpt2) {
  torch::manual_seed(0);
  Gpt model(Small());
  for (const auto& parameter : model->named_parameters()) {
    SCOPED_TRACE(parameter.key());
    const std::string& name = parameter.key();
    const at::Tensor& value = parameter.value();
    if (name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(at::equal(value, name.find("weight") != std::string::npos
                                       ? at::ones_like(value)
                                       : at::zeros_like(value)));
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_TRUE(at::equal(value, at::zeros_like(value)));
    } else {
      EXPECT_NEAR(value.std().item<double>(), 0.02, 0.004);  // >= 1024 draws: 20% is > 6 sigma
      EXPECT_NEAR(value.mean().item<double>(), 0.0, 0.004);
    }
  }
}

}  // namespace
}  // namespace keel::tools::recipe
