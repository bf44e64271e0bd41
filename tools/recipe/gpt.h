// The trainer's default model: a small GPT-style decoder-only transformer (pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, learned positions) whose lm_head shares its
// weight with the input embedding, so the tied-weight checkpoint path is exercised. It is
// built from Megatron-style tensor-parallel layers (parallel/tensor_parallel): over a
// tensor-parallel group of N ranks each holds 1/N of the heads, of the MLP and of the
// (padded) vocabulary, and computes what the model on one rank computes. Over a pipeline
// group of P stages each holds 1/P of the blocks (under their names in the whole model), the
// first the embeddings, the last the final norm and the head, with its own copy of the word
// embedding for the tie (Megatron's shared embedding). Whatever the groups, the weights are
// those of the model on one rank after the same seed, sliced.
//
//   keel::tools::recipe::GptOptions options;  // config.proto's model section
//   torch::manual_seed(seed);
//   keel::tools::recipe::Gpt model(options, tp, pp);  // nullptr: one rank, one stage
//   at::Tensor losses = model->TokenLosses(tokens, labels);  // [batch, seq], one stage
//   at::Tensor hidden = model->StageForward(tokens, input);  // a stage of several
#ifndef KEEL_TOOLS_RECIPE_GPT_H_
#define KEEL_TOOLS_RECIPE_GPT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "base/fields.h"
#include "parallel/layout.h"
#include "parallel/mesh_layout.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/normalization.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::tools::recipe {

struct GptOptions {
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

template <typename O, typename V, base::IsFieldsOf<O, GptOptions> = 0>
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
int64_t PaddedVocabSize(const GptOptions& options, int64_t tp_size);

// The elements of the parameters one rank of a pipeline stage holds, counted from the shapes
// the model registers, without building it (for --dry_run's memory): the experts' apart, as
// their state is sharded over the expert data-parallel ranks.
struct StageParameters {
  int64_t dense = 0;
  int64_t experts = 0;
};
// Stage `stage`'s, at the sizes of `parallel` (tensor, pipeline, expert, expert tensor);
// Requires: a layout the configuration's checks accepted.
StageParameters CountStageParameters(const GptOptions& options,
                                     const parallel::ModelParallelOptions& parallel, int64_t stage);

// What the mixture-of-experts blocks of a model routed in training since it was last taken,
// and the weight each micro-batch's load-balancing loss gets in the backward pass.
struct MoeStats {
  // The load-balancing losses (each block's, each micro-batch's), summed: a float64 scalar on
  // the model's device (no host synchronisation per block); undefined before any.
  at::Tensor aux_loss_sum;
  // Tokens routed to each expert (summed over the blocks), [num_moe_experts] int64 on the
  // model's device; undefined before any.
  at::Tensor tokens;
  // The gradient the load-balancing loss of a micro-batch receives (Megatron's
  // MoEAuxLossAutoScaler scale: 1 / the micro-batches of a step on a rank, times what the
  // gradients are divided by after the backward pass, if anything). Default: 1.
  double aux_loss_scale = 1.0;

  void Add(const at::Tensor& aux_loss, const at::Tensor& tokens_per_expert);
  // The sums so far ([1] float64, and [num_experts] int64: zeros before any), reset to none.
  std::pair<at::Tensor, at::Tensor> Take(int64_t num_experts);
};

class GptImpl : public torch::nn::Module {
 public:
  // Draws the weights of the model on one rank from the default generator (GPT-2's
  // initialisation: N(0, 0.02) for embeddings and projection weights, zero biases, LayerNorms
  // at (1, 0)) and keeps this rank's slice of them. Requires: all sizes positive; tp's size
  // divides num_attention_heads, which divides hidden_size, and ffn_hidden_size; pp's size
  // divides num_layers (checked by the caller's config validation). The experts of
  // mixture-of-experts blocks are split over `ep` by index and each over `expert_tp`
  // (parallel::SequentialMlp). The groups (nullptr: one rank, one stage) outlive the model.
  GptImpl(const GptOptions& options, c10d::ProcessGroup* tp, c10d::ProcessGroup* pp = nullptr,
          c10d::ProcessGroup* ep = nullptr, c10d::ProcessGroup* expert_tp = nullptr);

  // The groups a stage's layers are split over.
  struct Groups {
    c10d::ProcessGroup* tp = nullptr;
    c10d::ProcessGroup* ep = nullptr;
    c10d::ProcessGroup* expert_tp = nullptr;
  };

  // This rank's slice of the logits for every position of `tokens` ([batch, seq] int64,
  // seq <= max_sequence_length): [batch, seq, padded vocabulary / tp]. Requires: one stage.
  at::Tensor forward(const at::Tensor& tokens);

  // The cross-entropy of predicting `labels` ([batch, seq]) at every position, [batch, seq],
  // equal on every rank of the group (parallel::VocabParallelCrossEntropy).
  // Collective over `tp`, forward and backward (see parallel/tensor_parallel/mappings.h).
  // Requires: one stage.
  at::Tensor TokenLosses(const at::Tensor& tokens, const at::Tensor& labels);

  // This stage's blocks over the embedded `tokens` (first stage) or the previous stage's
  // output `input` (the others): the hidden states [batch, seq, hidden_size].
  at::Tensor StageForward(const at::Tensor& tokens, const at::Tensor& input);
  // TokenLosses over the last blocks' hidden states. Requires: the last stage.
  at::Tensor HeadLosses(const at::Tensor& hidden, const at::Tensor& labels);

  // The width of the hidden states between stages.
  int64_t hidden_size() const { return hidden_size_; }
  bool first_stage() const { return !wpe_.is_empty(); }
  bool last_stage() const { return !ln_f_.is_empty(); }

  // The layouts of this rank's sharded parameters, by name (empty on one rank).
  std::map<std::string, parallel::TensorLayout> Layouts() const;

  // lm_head.weight: the same tensor as wte.weight (on the last stage).
  const at::Tensor& lm_head_weight() const { return wte_->weight(); }

  // The mixture-of-experts blocks' statistics, and the load-balancing loss's weight.
  MoeStats& moe_stats() { return moe_stats_; }

 private:
  // The stage holding `layers` of the model with `padded_vocab_size` rows of vocabulary, the
  // embeddings if `first`, the head if `last`.
  GptImpl(const GptOptions& options, Groups groups, int64_t padded_vocab_size,
          parallel::StageLayers layers, bool first, bool last);

  // This rank's slice of the logits over the hidden states of the last block.
  at::Tensor Logits(const at::Tensor& hidden);

  c10d::ProcessGroup* tp_;
  int64_t hidden_size_;
  MoeStats moe_stats_;
  parallel::VocabParallelEmbedding wte_{nullptr};
  parallel::VocabParallelEmbedding wpe_{nullptr};
  // This stage's blocks, in order (registered under "blocks.<index in the whole model>").
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
};

TORCH_MODULE(Gpt);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_GPT_H_
