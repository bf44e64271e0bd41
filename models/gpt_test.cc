#include "models/gpt.h"

#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/named_parameters.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/layout_testutil.h"
#include "parallel/layout.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

namespace keel::models {
namespace {

ModelOptions Small() {
  ModelOptions options;
  options.hidden_size = 32;
  options.num_layers = 2;
  options.num_attention_heads = 4;
  options.ffn_hidden_size = 64;
  options.max_sequence_length = 16;
  return options;
}

TEST(GptTest, LmHeadIsTheInputEmbeddingItself) {
  torch::manual_seed(0);
  Gpt model(Small(), ModelGroups{});
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
  Gpt model(Small(), ModelGroups{});
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
  Gpt model(Small(), ModelGroups{});
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

TEST(GptTest, PadsTheVocabularyAsMegatron) {
  ModelOptions options;
  for (const auto& [vocab, divisible_by, tp, padded] :
       std::vector<std::array<int64_t, 4>>{{256, 128, 1, 256},
                                           {256, 128, 2, 256},
                                           {300, 128, 1, 384},
                                           {300, 128, 2, 512},
                                           {300, 1, 1, 300},
                                           {301, 1, 2, 302},
                                           {50257, 128, 8, 51200}}) {
    options.vocab_size = vocab;
    options.make_vocab_size_divisible_by = divisible_by;
    EXPECT_EQ(PaddedVocabSize(options, tp), padded) << vocab << " " << divisible_by << " " << tp;
  }
}

// This rank's block of `whole` (all of it without a layout).
at::Tensor Slice(const at::Tensor& whole,
                 const std::map<std::string, parallel::TensorLayout>& layouts,
                 const std::string& name, at::IntArrayRef shape) {
  auto it = layouts.find(name);
  return it == layouts.end() ? whole : parallel::BlockOf(whole, it->second, shape);
}

// The layout must not change the numbers: on 2 ranks each holds exactly its slice of the
// one-rank model's weights, and computes that model's losses and, slice for slice, gradients.
// The elements of `model`'s parameters (a tied one once), the experts' apart.
StageParameters Elements(torch::nn::Module& model) {
  StageParameters count;
  for (const auto& [name, param] : base::UniqueNamedParameters(model).unique) {
    (name.find(".experts.") != std::string::npos ? count.experts : count.dense) += param.numel();
  }
  return count;
}

// What --dry_run counts is what the model registers: one rank, and each rank of two tensor-
// parallel ranks, two pipeline stages, and two expert-parallel ranks of a MoE model whose
// second block is dense.
TEST(GptTest, CountsTheParametersItRegisters) {
  ModelOptions dense = Small();
  ModelOptions moe = Small();
  moe.num_moe_experts = 4;
  moe.moe_layer_freq = 2;
  for (const ModelOptions& options : {dense, moe}) {
    Gpt one(options, ModelGroups{});
    const StageParameters counted = CountGptStageParameters(options, {}, 0);
    const StageParameters registered = Elements(*one);
    EXPECT_EQ(counted.dense, registered.dense);
    EXPECT_EQ(counted.experts, registered.experts);
    EXPECT_EQ(counted.experts > 0, options.num_moe_experts > 0);
  }
  struct Layout {
    std::string name;
    parallel::ModelParallelOptions sizes;
  };
  parallel::ModelParallelOptions tp2, pp2, ep2;
  tp2.tensor_model_parallel_size = 2;
  pp2.pipeline_model_parallel_size = 2;
  ep2.expert_model_parallel_size = 2;
  for (const Layout& layout : {Layout{"tp2", tp2}, Layout{"pp2", pp2}, Layout{"ep2", ep2}}) {
    SCOPED_TRACE(layout.name);
    std::vector<StageParameters> registered(2), counted(2);
    KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
      c10d::ProcessGroup* group = r.group.get();
      const parallel::ModelParallelOptions& s = layout.sizes;
      Gpt model(moe, ModelGroups{s.tensor_model_parallel_size > 1 ? group : nullptr,
                                 s.pipeline_model_parallel_size > 1 ? group : nullptr,
                                 s.expert_model_parallel_size > 1 ? group : nullptr,
                                 s.tensor_model_parallel_size > 1 ? group : nullptr});
      registered[r.rank] = Elements(*model);
      counted[r.rank] =
          CountGptStageParameters(moe, s, s.pipeline_model_parallel_size > 1 ? r.rank : 0);
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(counted[rank].dense, registered[rank].dense) << "rank " << rank;
      EXPECT_EQ(counted[rank].experts, registered[rank].experts) << "rank " << rank;
    }
  }
}

TEST(GptTest, TwoTensorParallelRanksComputeTheOneRankModel) {
  // One thread for LibTorch's kernels, so the comparisons below see the layout's rounding
  // alone: the wheel's BLAS (MKL) rounds a threaded sgemm differently from call to call
  // (a loss 7e-6 off in about one run of 50, with the ranks' threads sharing 2 cores).
  at::set_num_threads(1);
  ModelOptions options = Small();
  options.num_layers = 1;
  torch::manual_seed(5);
  Gpt whole(options, ModelGroups{});
  const at::Tensor tokens = at::randint(256, {2, 10}, at::kLong);
  const at::Tensor labels = tokens.roll(-1, 1);
  const at::Tensor whole_losses = whole->TokenLosses(tokens, labels);
  whole_losses.sum().backward();
  std::mutex generator;  // the ranks are threads sharing the default generator
  std::vector<std::vector<std::string>> differing(2);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    std::optional<Gpt> model;
    {
      std::lock_guard<std::mutex> lock(generator);
      torch::manual_seed(5);
      model.emplace(options, ModelGroups{r.group.get()});
    }
    const std::map<std::string, parallel::TensorLayout> layouts = (*model)->Layouts();
    const at::Tensor losses = (*model)->TokenLosses(tokens, labels);
    losses.sum().backward();
    if (!at::allclose(losses, whole_losses, /*rtol=*/1e-6, /*atol=*/0)) {
      differing[r.rank].push_back("losses");
    }
    const auto expected = whole->named_parameters();
    for (const auto& item : (*model)->named_parameters()) {
      const at::IntArrayRef shape = item.value().sizes();
      if (!at::equal(item.value(), Slice(expected[item.key()], layouts, item.key(), shape))) {
        differing[r.rank].push_back(item.key() + " (weights)");
      }
      if (!at::allclose(item.value().grad(),
                        Slice(expected[item.key()].grad(), layouts, item.key(), shape),
                        /*rtol=*/1e-4, /*atol=*/1e-7)) {
        differing[r.rank].push_back(item.key() + " (gradient)");
      }
    }
    return absl::OkStatus();
  }));
  EXPECT_THAT(differing[0], ::testing::IsEmpty());
  EXPECT_THAT(differing[1], ::testing::IsEmpty());
}

// With sequence parallelism each rank's blocks hold half of the sequence; the LayerNorms' and the
// row-parallel biases' gradients, summed over the ranks, are the one-rank model's.
TEST(GptTest, SequenceParallelRanksComputeTheOneRankModel) {
  testing::ExpectTwoTensorParallelRanksComputeTheOneRankModel(Small(), /*sequence_parallel=*/true);
}

// Two pipeline stages: each holds the one-rank model's blocks of its half under their global
// names (the first the embeddings, the last the final norm and its own copy of the word
// embedding for the tied head), and the stages in turn compute the one-rank losses exactly.
TEST(GptTest, TwoPipelineStagesHoldAndComputeTheOneRankModel) {
  ModelOptions options = Small();
  options.num_layers = 4;
  torch::manual_seed(5);
  Gpt whole(options, ModelGroups{});
  const at::Tensor tokens = at::randint(256, {2, 10}, at::kLong);
  const at::Tensor labels = tokens.roll(-1, 1);
  std::mutex generator;  // the ranks are threads sharing the default generator
  std::vector<std::optional<Gpt>> stages(2);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    std::lock_guard<std::mutex> lock(generator);
    torch::manual_seed(5);
    stages[r.rank].emplace(options, ModelGroups{nullptr, r.group.get()});
    return absl::OkStatus();
  }));
  Gpt& first = *stages[0];
  Gpt& last = *stages[1];
  EXPECT_TRUE(first->first_stage());
  EXPECT_FALSE(first->last_stage());
  EXPECT_FALSE(last->first_stage());
  EXPECT_TRUE(last->last_stage());
  std::vector<std::vector<std::string>> names(2);
  const auto expected = whole->named_parameters();
  for (int stage = 0; stage < 2; ++stage) {
    for (const auto& item : (*stages[stage])->named_parameters()) {
      names[stage].push_back(item.key());
      EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
    }
  }
  using ::testing::Contains;
  using ::testing::Not;
  EXPECT_THAT(names[0], Contains("wte.weight"));
  EXPECT_THAT(names[0], Contains("wpe.weight"));
  EXPECT_THAT(names[0], Contains("blocks.1.fc.weight"));
  EXPECT_THAT(names[0], Not(Contains("blocks.2.fc.weight")));
  EXPECT_THAT(names[0], Not(Contains("ln_f.weight")));
  EXPECT_THAT(names[1], Contains("wte.weight"));
  EXPECT_THAT(names[1], Not(Contains("wpe.weight")));
  EXPECT_THAT(names[1], Contains("blocks.2.fc.weight"));
  EXPECT_THAT(names[1], Not(Contains("blocks.1.fc.weight")));
  EXPECT_THAT(names[1], Contains("ln_f.weight"));
  EXPECT_TRUE(last->named_parameters()["lm_head.weight"].is_same(last->lm_head_weight()));

  const at::Tensor hidden = first->StageForward(tokens, at::Tensor(), nullptr);
  const at::Tensor losses = last->HeadLosses(last->StageForward(tokens, hidden, nullptr), labels);
  EXPECT_TRUE(at::equal(losses, whole->TokenLosses(tokens, labels)));
}

TEST(GptTest, LaysOutTheHeadsTheMlpAndTheTiedVocabulary) {
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    ModelOptions options = Small();
    options.num_layers = 1;
    Gpt model(options, ModelGroups{r.group.get()});
    const std::map<std::string, parallel::TensorLayout> layouts = model->Layouts();
    std::vector<std::string> names;
    for (const auto& [name, layout] : layouts) names.push_back(name);
    EXPECT_THAT(names, ::testing::ElementsAre("blocks.0.attn.proj.weight", "blocks.0.attn.qkv.bias",
                                              "blocks.0.attn.qkv.weight", "blocks.0.fc.bias",
                                              "blocks.0.fc.weight", "blocks.0.mlp_proj.weight",
                                              "lm_head.weight", "wte.weight"));
    EXPECT_EQ(layouts.at("wte.weight").global_shape, (std::vector<int64_t>{256, 32}));
    EXPECT_EQ(layouts.at("wte.weight").offsets, (std::vector<int64_t>{128 * r.rank, 0}));
    EXPECT_EQ(layouts.at("lm_head.weight").offsets, layouts.at("wte.weight").offsets);
    EXPECT_EQ(layouts.at("blocks.0.attn.qkv.weight").offsets,
              (std::vector<int64_t>{48 * r.rank, 0}));  // heads 0-1, then 2-3: 2 x 3 x 8 rows
    EXPECT_TRUE(model->lm_head_weight().is_same(model->named_parameters()["lm_head.weight"]));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::models
