#include "tools/recipe/gpt.h"

#include <cmath>
#include <memory>

#include "ATen/ATen.h"
#include "torch/nn/functional/activation.h"
#include "torch/nn/modules/linear.h"

namespace keel::tools::recipe {
namespace {

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptOptions& options)
      : heads_(options.num_attention_heads),
        ln_1_(register_module(
            "ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.hidden_size})))),
        qkv_(register_module("qkv",
                             torch::nn::Linear(options.hidden_size, 3 * options.hidden_size))),
        attn_proj_(register_module("attn_proj",
                                   torch::nn::Linear(options.hidden_size, options.hidden_size))),
        ln_2_(register_module(
            "ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.hidden_size})))),
        fc_(register_module("fc", torch::nn::Linear(options.hidden_size, options.ffn_hidden_size))),
        mlp_proj_(register_module(
            "mlp_proj", torch::nn::Linear(options.ffn_hidden_size, options.hidden_size))) {}

  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask) {
    const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2);
    const int64_t head_dim = hidden / heads_;
    std::vector<at::Tensor> qkv = qkv_->forward(ln_1_->forward(x)).chunk(3, /*dim=*/-1);
    auto heads = [&](const at::Tensor& t) {
      return t.view({batch, seq, heads_, head_dim}).transpose(1, 2);
    };
    at::Tensor scores = at::matmul(heads(qkv[0]), heads(qkv[1]).transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(head_dim));
    scores = scores.masked_fill(causal_mask, -std::numeric_limits<float>::infinity());
    at::Tensor attended = at::matmul(at::softmax(scores, -1), heads(qkv[2]));
    attended = attended.transpose(1, 2).contiguous().view({batch, seq, hidden});
    at::Tensor h = x + attn_proj_->forward(attended);
    return h + mlp_proj_->forward(at::gelu(fc_->forward(ln_2_->forward(h))));
  }

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln_1_;
  torch::nn::Linear qkv_;
  torch::nn::Linear attn_proj_;
  torch::nn::LayerNorm ln_2_;
  torch::nn::Linear fc_;
  torch::nn::Linear mlp_proj_;
};

TORCH_MODULE(Block);

// The output projection, holding the embedding's weight itself (a tie, not a copy).
class LmHeadImpl : public torch::nn::Module {
 public:
  explicit LmHeadImpl(const at::Tensor& tied) { register_parameter("weight", tied); }
};

TORCH_MODULE(LmHead);

}  // namespace

GptImpl::GptImpl(const GptOptions& options) : options_(options) {
  wte_ = register_module("wte", torch::nn::Embedding(options.vocab_size, options.hidden_size));
  wpe_ = register_module("wpe",
                         torch::nn::Embedding(options.max_sequence_length, options.hidden_size));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < options.num_layers; ++i) blocks_->push_back(Block(options));
  ln_f_ = register_module("ln_f",
                          torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.hidden_size})));
  // GPT-2's initialisation: N(0, 0.02) for embeddings and projection weights, zero biases
  // (LayerNorms keep their ones and zeros).
  at::NoGradGuard no_grad;
  for (auto& parameter : named_parameters()) {
    if (parameter.key().find("ln_") != std::string::npos) continue;
    if (parameter.key().find(".bias") != std::string::npos) {
      parameter.value().zero_();
    } else {
      parameter.value().normal_(0.0, 0.02);
    }
  }
  lm_head_weight_ = wte_->weight;
  register_module("lm_head", LmHead(lm_head_weight_));
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  const int64_t seq = tokens.size(1);
  const at::Tensor positions = at::arange(seq, tokens.options().dtype(at::kLong));
  at::Tensor x = wte_->forward(tokens) + wpe_->forward(positions);
  const at::Tensor causal_mask =
      at::ones({seq, seq}, tokens.options().dtype(at::kBool)).triu(/*diagonal=*/1);
  for (const auto& block : *blocks_) x = block->as<BlockImpl>()->forward(x, causal_mask);
  return at::linear(ln_f_->forward(x), lm_head_weight_);
}

}  // namespace keel::tools::recipe
