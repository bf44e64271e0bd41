// The Llama family's layouts and bookkeeping (its numbers against transformers are
// llama_hf_parity_test's): two tensor-parallel ranks and two pipeline stages compute the
// one-rank model for each family, tied and untied, with grouped-query heads, a head width other
// than hidden / heads and a padded vocabulary; --dry_run's count is what the model registers.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/named_parameters.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/layout_testutil.h"
#include "models/registry.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::models {
namespace {

// Vocabulary 131 padded to 132 rows (on one rank as on two, so that both draw the same
// weights), 4 query heads over 2 key-value heads of 12.
ModelOptions Small(ModelFamily family, bool tied) {
  ModelOptions options;
  options.family = family;
  options.vocab_size = 131;
  options.make_vocab_size_divisible_by = 2;
  options.hidden_size = 32;
  options.ffn_hidden_size = 48;
  options.num_layers = 2;
  options.num_attention_heads = 4;
  options.num_query_groups = 2;
  options.kv_channels = 12;
  options.rotary_base = 500000;
  options.rope_scaling_factor = 4;
  options.rope_original_max_position_embeddings = 4;
  options.untie_embeddings_and_output_weights = !tied;
  options.window_size = family == ModelFamily::kMistral ? 4 : 0;
  return options;
}

struct Case {
  std::string name;
  ModelOptions options;
};

std::vector<Case> Cases() {
  return {{"llama_tied", Small(ModelFamily::kLlama, true)},
          {"llama_untied", Small(ModelFamily::kLlama, false)},
          {"qwen2", Small(ModelFamily::kQwen2, true)},
          {"qwen3", Small(ModelFamily::kQwen3, false)},
          {"mistral", Small(ModelFamily::kMistral, false)}};
}

TEST(LlamaTest, TwoTensorParallelRanksComputeTheOneRankModel) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    testing::ExpectTwoTensorParallelRanksComputeTheOneRankModel(c.options);
  }
}

// With sequence parallelism each rank's layers hold half of the sequence (the embedding
// reduce-scatters it, the output layer gathers it); the RMSNorms' gradients, summed over the
// ranks, are the one-rank model's.
TEST(LlamaTest, SequenceParallelRanksComputeTheOneRankModel) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    testing::ExpectTwoTensorParallelRanksComputeTheOneRankModel(c.options,
                                                                /*sequence_parallel=*/true);
  }
}

TEST(LlamaTest, TwoPipelineStagesComputeTheOneRankModel) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    testing::ExpectTwoPipelineStagesComputeTheOneRankModel(c.options);
  }
}

// HF's names; a tied output layer is the embedding itself, and over pipeline stages the last
// stage's copy of it is the shared parameter; untied, nothing is shared.
TEST(LlamaTest, NamesAreHuggingFacesAndTheTieIsShared) {
  const std::shared_ptr<LanguageModel> tied =
      BuildLanguageModel(Small(ModelFamily::kQwen3, true), {});
  const auto parameters = tied->named_parameters();
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_norm.weight",
        "model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"}) {
    EXPECT_TRUE(parameters.contains(name)) << name;
  }
  EXPECT_TRUE(parameters["lm_head.weight"].is_same(parameters["model.embed_tokens.weight"]));
  EXPECT_EQ(parameters["model.layers.0.self_attn.k_proj.weight"].sizes(),
            (at::IntArrayRef{24, 32}));              // 2 key-value heads of 12
  EXPECT_EQ(tied->SharedEmbedding(), std::nullopt);  // one stage
  std::vector<std::optional<std::string>> shared(2), untied_shared(2);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
    shared[r.rank] =
        BuildLanguageModel(Small(ModelFamily::kLlama, true), ModelGroups{nullptr, r.group.get()})
            ->SharedEmbedding();
    untied_shared[r.rank] =
        BuildLanguageModel(Small(ModelFamily::kLlama, false), ModelGroups{nullptr, r.group.get()})
            ->SharedEmbedding();
    return absl::OkStatus();
  }));
  EXPECT_EQ(shared[1], "model.embed_tokens.weight");
  EXPECT_EQ(untied_shared[1], std::nullopt);
}

// The padding row of the vocabulary takes no part in the softmax: the losses at tp = 2 (131 ->
// 132 rows) are the unpadded model's.
TEST(LlamaTest, PaddingRowsAreOutsideTheSoftmax) {
  ModelOptions options = Small(ModelFamily::kLlama, false);
  options.make_vocab_size_divisible_by = 64;  // 131 -> 192 rows on one rank
  torch::manual_seed(1);
  const std::shared_ptr<LanguageModel> padded = BuildLanguageModel(options, {});
  const at::Tensor tokens = at::randint(131, {2, 6}, at::kLong);
  const at::Tensor hidden = padded->StageForward(tokens, {}, nullptr);
  const at::Tensor logits = padded->Logits(hidden);
  ASSERT_EQ(logits.size(-1), 192);
  const at::Tensor expected = at::cross_entropy_loss(logits.narrow(-1, 0, 131).reshape({-1, 131}),
                                                     tokens.reshape({-1}), {}, at::Reduction::None);
  EXPECT_TRUE(at::allclose(padded->HeadLosses(hidden, tokens).reshape({-1}), expected, 1e-6, 1e-6));
}

// What --dry_run counts is what each rank registers: one rank, two tensor-parallel ranks, two
// pipeline stages.
TEST(LlamaTest, CountsTheParametersItRegisters) {
  const auto registered = [](const LanguageModel& model) {
    int64_t count = 0;
    for (const auto& [name, param] : base::UniqueNamedParameters(model).unique) {
      count += param.numel();
    }
    return count;
  };
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(CountStageParameters(c.options, {}, 0).dense,
              registered(*BuildLanguageModel(c.options, {})));
    parallel::ModelParallelOptions tp2, pp2;
    tp2.tensor_model_parallel_size = 2;
    pp2.pipeline_model_parallel_size = 2;
    std::vector<int64_t> tp_counts(2), pp_counts(2);
    KEEL_ASSERT_OK(keel::testing::RunOnRanks(2, [&](keel::testing::Rank& r) -> absl::Status {
      tp_counts[r.rank] = registered(*BuildLanguageModel(c.options, ModelGroups{r.group.get()}));
      pp_counts[r.rank] =
          registered(*BuildLanguageModel(c.options, ModelGroups{nullptr, r.group.get()}));
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(CountStageParameters(c.options, tp2, 0).dense, tp_counts[rank]);
      EXPECT_EQ(CountStageParameters(c.options, pp2, rank).dense, pp_counts[rank]);
    }
  }
}

}  // namespace
}  // namespace keel::models
