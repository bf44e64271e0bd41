// Keel's GPT: a GPT-2-style decoder-only transformer (pre-LayerNorm blocks of causal
// self-attention and a GELU MLP, learned positions) whose lm_head shares its weight with the
// input embedding, the trainer's default model. It is built from Megatron-style tensor-parallel
// layers (parallel/tensor_parallel): over a tensor-parallel group of N ranks each holds 1/N of
// the heads, of the MLP and of the (padded) vocabulary, and computes what the model on one rank
// computes. Over a pipeline group of P stages each holds 1/P of the blocks (under their names in
// the whole model), the first the embeddings, the last the final norm and the head, with its
// own copy of the word embedding for the tie (Megatron's shared embedding). With sequence
// parallelism (groups.sequence_parallel) the embeddings' sum is scattered along the sequence,
// the LayerNorms and the residual stream hold this rank's 1/N of it, and the head gathers it.
// Whatever the groups, the weights are those of the model on one rank after the same seed,
// sliced.
//
//   keel::models::ModelOptions options;  // config.proto's model section
//   torch::manual_seed(seed);
//   keel::models::Gpt model(options, {.tp = tp, .pp = pp});  // {}: one rank, one stage
//   at::Tensor losses = model->TokenLosses(tokens, labels);  // [batch, seq], one stage
//   at::Tensor hidden = model->StageForward(tokens, input, nullptr);  // a stage of several
#ifndef KEEL_MODELS_GPT_H_
#define KEEL_MODELS_GPT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "models/language_model.h"
#include "models/model_options.h"
#include "parallel/layout.h"
#include "parallel/mesh_layout.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/modules/normalization.h"
#include "torch/nn/pimpl.h"

namespace keel::models {

// The parameters one rank of stage `stage` holds at the sizes of `parallel` (tensor, pipeline,
// expert, expert tensor). Requires: a layout the configuration's checks accepted.
StageParameters CountGptStageParameters(const ModelOptions& options,
                                        const parallel::ModelParallelOptions& parallel,
                                        int64_t stage);

class GptImpl : public LanguageModel, public parallel::SequenceSplit {
 public:
  // Draws the weights of the model on one rank from the default generator (GPT-2's
  // initialisation: N(0, 0.02) for embeddings and projection weights, zero biases, LayerNorms
  // at (1, 0)) and keeps this rank's slice of them. Requires: all sizes positive; tp's size
  // divides num_attention_heads, which divides hidden_size, and ffn_hidden_size; pp's size
  // divides num_layers (checked by the caller's config validation). The experts of
  // mixture-of-experts blocks are split over `ep` by index and each over `expert_tp`
  // (parallel::SequentialMlp); with groups.sequence_parallel those blocks take the whole
  // sequence, gathered (parallel::SumExpertParts).
  GptImpl(const ModelOptions& options, const ModelGroups& groups);

  at::Tensor StageForward(const at::Tensor& tokens, const at::Tensor& input,
                          const base::PackedSequences* packed) override;
  at::Tensor Logits(const at::Tensor& hidden) override;
  at::Tensor HeadLosses(const at::Tensor& hidden, const at::Tensor& labels) override;
  int64_t hidden_size() const override { return hidden_size_; }
  bool first_stage() const override { return !wpe_.is_empty(); }
  bool last_stage() const override { return !ln_f_.is_empty(); }
  // "wte.weight" on the first and last stage of several.
  std::optional<std::string> SharedEmbedding() const override;

  std::vector<std::string> VocabParameters() const override;
  // ln_f's, on the last stage with sequence parallelism (the blocks name their own).
  std::vector<std::string> LocalSequenceParallelParameters() const override;

  // lm_head.weight: the same tensor as wte.weight (on the last stage).
  const at::Tensor& lm_head_weight() const { return wte_->weight(); }

 private:
  // The stage holding `layers` of the model with `padded_vocab_size` rows of vocabulary, the
  // embeddings if `first`, the head if `last`.
  GptImpl(const ModelOptions& options, const ModelGroups& groups, int64_t padded_vocab_size,
          parallel::StageLayers layers, bool first, bool last);
  // The final norm's output as the column-parallel output layer's input region (whole on every
  // rank: with sequence parallelism, gathered).
  at::Tensor HeadInput(const at::Tensor& hidden);

  c10d::ProcessGroup* tp_;
  int64_t hidden_size_;
  bool pipelined_;
  parallel::RecomputeOptions recompute_;
  int64_t cross_entropy_chunk_len_;
  parallel::VocabParallelEmbedding wte_{nullptr};
  parallel::VocabParallelEmbedding wpe_{nullptr};
  // This stage's blocks, in order (registered under "blocks.<index in the whole model>").
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
};

TORCH_MODULE(Gpt);

}  // namespace keel::models

#endif  // KEEL_MODELS_GPT_H_
