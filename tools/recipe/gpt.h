// The trainer's default model: a small GPT-style decoder-only transformer (pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, learned positions) whose lm_head shares its
// weight with the input embedding, so the tied-weight checkpoint path is exercised.
//
//   keel::tools::recipe::GptOptions options;  // config.proto's model section
//   keel::tools::recipe::Gpt model(options);
//   at::Tensor logits = model->forward(tokens);  // [batch, seq] int64 -> [batch, seq, vocab]
#ifndef KEEL_TOOLS_RECIPE_GPT_H_
#define KEEL_TOOLS_RECIPE_GPT_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "base/fields.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/container/modulelist.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/normalization.h"
#include "torch/nn/pimpl.h"

namespace keel::tools::recipe {

struct GptOptions {
  // Tokens of the vocabulary (256 for bytes). Default: 256.
  int64_t vocab_size = 256;
  // Width of the residual stream. Default: 128.
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_attention_heads = 4;
  // Width of the MLP. Default: 512.
  int64_t ffn_hidden_size = 512;
  // Longest input (positions learned). Default: 128.
  int64_t max_sequence_length = 128;
};

template <typename O, typename V, base::IsFieldsOf<O, GptOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("vocab_size", o.vocab_size);
  v("hidden_size", o.hidden_size);
  v("num_layers", o.num_layers);
  v("num_attention_heads", o.num_attention_heads);
  v("ffn_hidden_size", o.ffn_hidden_size);
}

class GptImpl : public torch::nn::Module {
 public:
  // Requires: hidden_size divisible by num_attention_heads, all sizes positive (checked by
  // the caller's config validation).
  explicit GptImpl(const GptOptions& options);

  // Logits for every position of `tokens` ([batch, seq], seq <= max_sequence_length).
  at::Tensor forward(const at::Tensor& tokens);

  // lm_head.weight: the same tensor as wte.weight.
  const at::Tensor& lm_head_weight() const { return lm_head_weight_; }

 private:
  GptOptions options_;
  torch::nn::Embedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  at::Tensor lm_head_weight_;
};

TORCH_MODULE(Gpt);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_GPT_H_
