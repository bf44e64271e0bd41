// The model section of the trainer's configuration (tools/recipe/config.proto's ModelConfig),
// under Megatron-Core's names: the sizes of a decoder-only transformer and its mixture of
// experts. Every family (models/gpt.h, models/llama.h) reads what it needs of it.
#ifndef KEEL_MODELS_MODEL_OPTIONS_H_
#define KEEL_MODELS_MODEL_OPTIONS_H_

#include <cstdint>

#include "base/fields.h"

namespace keel::models {

struct ModelOptions {
  // Tokens of the vocabulary (256 for bytes). Default: 256.
  int64_t vocab_size = 256;
  // The embedding and the lm_head hold the vocabulary rounded up to a multiple of this times
  // the tensor-parallel size, as Megatron's make_vocab_size_divisible_by (the padding rows are
  // trained like the others; no label names them). Default: 128, Megatron's.
  int64_t make_vocab_size_divisible_by = 128;
  // Width of the residual stream. Default: 128.
  int64_t hidden_size = 128;
  int64_t num_layers = 4;
  int64_t num_attention_heads = 4;
  // Width of the MLP. Default: 512.
  int64_t ffn_hidden_size = 512;
  // Longest input (positions learned). Default: 128.
  int64_t max_sequence_length = 128;
  // Mixture of experts (Megatron's names): experts per MoE block (0: every block dense), the
  // experts per token, the load-balancing loss's coefficient, which blocks (every
  // moe_layer_freq-th from the first) and the router's softmax order. Each expert is an MLP of
  // ffn_hidden_size without biases.
  int64_t num_moe_experts = 0;
  int64_t moe_router_topk = 2;
  double moe_aux_loss_coeff = 0.0;
  int64_t moe_layer_freq = 1;
  bool moe_router_pre_softmax = false;
};

template <typename O, typename V, base::IsFieldsOf<O, ModelOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("vocab_size", o.vocab_size);
  v("hidden_size", o.hidden_size);
  v("num_layers", o.num_layers);
  v("num_attention_heads", o.num_attention_heads);
  v("ffn_hidden_size", o.ffn_hidden_size);
  v("make_vocab_size_divisible_by", o.make_vocab_size_divisible_by);
  v("num_moe_experts", o.num_moe_experts);
  v("moe_router_topk", o.moe_router_topk);
  v("moe_aux_loss_coeff", o.moe_aux_loss_coeff);
  v("moe_layer_freq", o.moe_layer_freq);
  v("moe_router_pre_softmax", o.moe_router_pre_softmax);
}

// The rows of the embedding at tensor-parallel size `tp_size`: vocab_size rounded up to a
// multiple of make_vocab_size_divisible_by x tp_size (Megatron's _vocab_size_with_padding).
int64_t PaddedVocabSize(const ModelOptions& options, int64_t tp_size);

}  // namespace keel::models

#endif  // KEEL_MODELS_MODEL_OPTIONS_H_
