// Every family on packed rows (base::PackedSequences): each conversation packed with others
// into a row predicts its tokens as it does alone, its positions restarting at 0 (GPT's learned
// positions and RoPE alike) and its attention never reaching the others (Mistral's window
// too), and the gradients of the packed rows' loss are those of the conversations' losses run
// one by one.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "base/attention.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "torch/torch.h"

namespace keel::models {
namespace {

ModelOptions Small(ModelFamily family) {
  ModelOptions options;
  options.family = family;
  options.vocab_size = 131;
  options.make_vocab_size_divisible_by = 2;
  options.hidden_size = 32;
  options.ffn_hidden_size = 48;
  options.num_layers = 2;
  options.num_attention_heads = 4;
  options.max_sequence_length = 12;  // the longest conversation: GPT's positions stop there
  if (family != ModelFamily::kGpt) {
    options.num_query_groups = 2;
    options.kv_channels = 12;
    options.untie_embeddings_and_output_weights = family == ModelFamily::kQwen3;
  }
  options.window_size = family == ModelFamily::kMistral ? 4 : 0;
  return options;
}

// Two rows of 20 tokens: conversations of 5, 9 and 3 inputs then 3 of padding, and of 12 and 8.
const std::vector<std::vector<int64_t>> kRows = {{5, 9, 3}, {12, 8}};
constexpr int64_t kSeq = 20;

TEST(PackedSequencesTest, EachConversationIsPredictedAsAlone) {
  for (const ModelFamily family : {ModelFamily::kGpt, ModelFamily::kLlama, ModelFamily::kQwen2,
                                   ModelFamily::kQwen3, ModelFamily::kMistral}) {
    SCOPED_TRACE(static_cast<int>(family));
    torch::manual_seed(7);
    const std::shared_ptr<LanguageModel> model = BuildLanguageModel(Small(family), {});
    const at::Tensor tokens = at::randint(131, {2, kSeq}, at::kLong);
    const at::Tensor labels = at::randint(131, {2, kSeq}, at::kLong);
    const base::PackedSequences packed = base::PackRows(kRows, kSeq);

    const at::Tensor packed_losses = model->TokenLosses(tokens, labels, &packed);
    std::vector<at::Tensor> loss_terms;
    for (size_t r = 0; r < kRows.size(); ++r) {
      int64_t begin = 0;
      for (const int64_t length : kRows[r]) {
        loss_terms.push_back(packed_losses[r].narrow(0, begin, length));
        begin += length;
      }
    }
    at::cat(loss_terms).sum().backward();
    std::vector<at::Tensor> packed_grads;
    for (const at::Tensor& p : model->parameters()) packed_grads.push_back(p.grad().clone());
    model->zero_grad();

    at::Tensor alone_sum = at::zeros({});
    size_t term = 0;
    for (size_t r = 0; r < kRows.size(); ++r) {
      int64_t begin = 0;
      for (const int64_t length : kRows[r]) {
        const at::Tensor losses =
            model->TokenLosses(tokens[r].narrow(0, begin, length).unsqueeze(0),
                               labels[r].narrow(0, begin, length).unsqueeze(0))[0];
        EXPECT_TRUE(at::allclose(loss_terms[term].detach(), losses.detach(), 1e-5, 1e-6))
            << "row " << r << ", the conversation at " << begin << ": max difference "
            << (loss_terms[term] - losses).abs().max().item<float>();
        alone_sum = alone_sum + losses.sum();
        begin += length;
        ++term;
      }
    }
    alone_sum.backward();
    size_t i = 0;
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& grad = item.value().grad();
      EXPECT_TRUE(at::allclose(packed_grads[i], grad, 1e-4, 1e-6))
          << item.key() << ": max difference "
          << (packed_grads[i] - grad).abs().max().item<float>();
      ++i;
    }
  }
}

}  // namespace
}  // namespace keel::models
