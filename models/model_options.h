// The model section of the trainer's configuration (tools/recipe/config.proto's ModelConfig),
// under Megatron-Core's names: the family, the sizes of a decoder-only transformer, its
// attention and position embedding, and its mixture of experts. Every family (models/gpt.h,
// models/llama.h) reads what it needs of it; a Hugging Face config.json maps onto it
// (models/hf_config.h).
#ifndef KEEL_MODELS_MODEL_OPTIONS_H_
#define KEEL_MODELS_MODEL_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "parallel/recompute.h"

namespace keel::models {

// The architectures: Keel's GPT-2-style model, and the Hugging Face families of Llama's layout
// (RMSNorm, RoPE, SwiGLU, grouped-query attention): Llama, Qwen2 (q/k/v biases), Qwen3
// (per-head q/k RMSNorms), Mistral (a sliding window).
enum class ModelFamily { kGpt, kLlama, kQwen2, kQwen3, kMistral };
// "gpt", "llama", "qwen2", "qwen3", "mistral" (the last four HF's model_type).
bool AbslParseFlag(absl::string_view text, ModelFamily* out, std::string* error);
std::string AbslUnparseFlag(ModelFamily family);

struct ModelOptions {
  // Default: "gpt".
  ModelFamily family = ModelFamily::kGpt;
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
  // Longest input (GPT's positions are learned). Default: 128.
  int64_t max_sequence_length = 128;
  // Llama-style families only. Key-value heads of grouped-query attention (HF's
  // num_key_value_heads; 0: num_attention_heads); the width of a head (HF's head_dim; 0:
  // hidden_size / num_attention_heads); RoPE's base (HF's rope_theta) and Llama 3.1's
  // rescaling (factor 0: none; HF's rope_scaling of rope_type "llama3"); RMSNorm's epsilon
  // (HF's rms_norm_eps); a separate output layer (HF's tie_word_embeddings false); the sliding
  // window (Mistral's sliding_window; 0: none).
  int64_t num_query_groups = 0;
  int64_t kv_channels = 0;
  double rotary_base = 10000.0;
  double rope_scaling_factor = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  double norm_epsilon = 1e-5;
  bool untie_embeddings_and_output_weights = false;
  int64_t window_size = 0;
  // Mixture of experts (Megatron's names): experts per MoE block (0: every block dense), the
  // experts per token, the load-balancing loss's coefficient, which blocks (every
  // moe_layer_freq-th from the first) and the router's softmax order. Each expert is an MLP of
  // ffn_hidden_size without biases.
  int64_t num_moe_experts = 0;
  int64_t moe_router_topk = 2;
  double moe_aux_loss_coeff = 0.0;
  int64_t moe_layer_freq = 1;
  bool moe_router_pre_softmax = false;
  // Activation recomputation during training (Megatron-Core's recompute_* fields, in section
  // model; not the model's shape, so outside VisitFields). Default: none.
  parallel::RecomputeOptions recompute;
  // The output layer and the loss over chunks of this many positions, so that no more than a
  // chunk's logits exist (parallel::LinearCrossEntropy; the trainer's loss_fn.chunk_len); 0: the
  // micro-batch's logits whole. Default (nullopt): CrossEntropyChunkLen's choice.
  std::optional<int64_t> cross_entropy_chunk_len;
};

template <typename O, typename V, base::IsFieldsOf<O, ModelOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("family", o.family);
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
  v("num_query_groups", o.num_query_groups);
  v("kv_channels", o.kv_channels);
  v("rotary_base", o.rotary_base);
  v("rope_scaling_factor", o.rope_scaling_factor);
  v("rope_low_freq_factor", o.rope_low_freq_factor);
  v("rope_high_freq_factor", o.rope_high_freq_factor);
  v("rope_original_max_position_embeddings", o.rope_original_max_position_embeddings);
  v("norm_epsilon", o.norm_epsilon);
  v("untie_embeddings_and_output_weights", o.untie_embeddings_and_output_weights);
  v("window_size", o.window_size);
}

// The largest size a model takes (int32's largest): products of a few sizes stay exact in 64
// bits, and LibTorch's kernels index with int32.
inline constexpr int64_t kMaxSize = 2147483647;

// The width of a head and the key-value heads, their defaults resolved.
int64_t HeadDim(const ModelOptions& options);
int64_t KvHeads(const ModelOptions& options);

// The rows of the embedding at tensor-parallel size `tp_size`: vocab_size rounded up to a
// multiple of make_vocab_size_divisible_by x tp_size (Megatron's _vocab_size_with_padding).
int64_t PaddedVocabSize(const ModelOptions& options, int64_t tp_size);

// The positions of a chunk of the loss: cross_entropy_chunk_len when set, else
// kDefaultCrossEntropyChunkLen for a padded vocabulary of kChunkedVocabSize or more (Llama 3's
// 128,256, Qwen2's 151,936: a micro-batch's float32 logits outweigh its layers' activations),
// and 0 below (GPT-2's 50,304: the logits are a smaller share, and the chunks' second output-layer
// GEMM would cost time for little memory).
inline constexpr int64_t kDefaultCrossEntropyChunkLen = 1024;
inline constexpr int64_t kChunkedVocabSize = 65536;
int64_t CrossEntropyChunkLen(const ModelOptions& options);

}  // namespace keel::models

#endif  // KEEL_MODELS_MODEL_OPTIONS_H_
