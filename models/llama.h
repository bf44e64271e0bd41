// The Llama family under Hugging Face's tensor names (LlamaForCausalLM's state dict, so that a
// Hugging Face checkpoint loads and exports without renaming): RMSNorm before attention and the
// MLP, grouped-query attention with RoPE (models/attention.h), SwiGLU (models/gated_mlp.h), a
// final RMSNorm and an output layer tied to the embedding or not; Qwen2 (q/k/v biases), Qwen3
// (q/k norms) and Mistral (a sliding window) are the same layout with their differences
// (ModelOptions::family). Split as the GPT is: over a tensor-parallel group each rank holds its
// heads, its slice of the MLP and of the padded vocabulary; over a pipeline group each stage
// its layers under their global names, the first the embedding, the last the final norm and
// the output layer (and, when tied, its own copy of the embedding); the weights are those of
// the model on one rank after the same seed (HF's initialisation: N(0, 0.02) for the
// embedding and the linear layers, norms at one, biases at zero), sliced. The vocabulary's
// padding rows are left out of the softmax: the losses are those of the unpadded model. With
// sequence parallelism (groups.sequence_parallel) the embedding reduce-scatters its output
// along the sequence, the RMSNorms and the residual stream hold this rank's share of it, and
// the output layer gathers it.
//
//   torch::manual_seed(seed);
//   Llama model(options, groups);  // options.family: llama, qwen2, qwen3 or mistral
//   at::Tensor losses = model->TokenLosses(tokens, labels);
#ifndef KEEL_MODELS_LLAMA_H_
#define KEEL_MODELS_LLAMA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "models/language_model.h"
#include "models/model_options.h"
#include "models/rms_norm.h"
#include "models/rotary.h"
#include "parallel/mesh_layout.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/pimpl.h"

namespace keel::models {

// The parameters one rank of stage `stage` holds at the sizes of `parallel`. Requires: a
// layout the configuration's checks accepted.
StageParameters CountLlamaStageParameters(const ModelOptions& options,
                                          const parallel::ModelParallelOptions& parallel,
                                          int64_t stage);

// The whole shapes of the parameters of a one-layer model of `options`, by Hugging Face name
// ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", ...), read off its
// modules built on the meta device: nothing allocated or drawn but RoPE's inverse
// frequencies. Throws c10::Error for sizes no tensor can have.
std::map<std::string, std::vector<int64_t>> LlamaLayerShapes(const ModelOptions& options);

class LlamaImpl : public LanguageModel, public parallel::SequenceSplit {
 public:
  // Requires: a Llama-style family; sizes positive; num_query_groups divides
  // num_attention_heads; tp's size divides num_query_groups and ffn_hidden_size; pp's size
  // divides num_layers (the configuration's checks). No mixture of experts.
  LlamaImpl(const ModelOptions& options, const ModelGroups& groups);

  at::Tensor StageForward(const at::Tensor& tokens, const at::Tensor& input,
                          const base::PackedSequences* packed) override;
  at::Tensor Logits(const at::Tensor& hidden) override;
  at::Tensor HeadLosses(const at::Tensor& hidden, const at::Tensor& labels) override;
  int64_t hidden_size() const override { return options_.hidden_size; }
  bool first_stage() const override { return first_; }
  bool last_stage() const override { return last_; }
  // "model.embed_tokens.weight" when tied, on the first and last stage of several.
  std::optional<std::string> SharedEmbedding() const override;
  std::vector<std::string> VocabParameters() const override;
  // The final norm's, on the last stage with sequence parallelism (the layers name their own).
  std::vector<std::string> LocalSequenceParallelParameters() const override;

 private:
  friend std::map<std::string, std::vector<int64_t>> LlamaLayerShapes(const ModelOptions&);
  // The modules of the stage holding `layers` (and the embedding if `first`, the head if
  // `last`), with `padded_vocab_size` rows of vocabulary; their parameters as allocated.
  LlamaImpl(const ModelOptions& options, const ModelGroups& groups, int64_t padded_vocab_size,
            parallel::StageLayers layers, bool first, bool last);
  // The RoPE tables for `seq` positions in `like`'s dtype on its device (kept for the next
  // micro-batch of the same length).
  const RotaryTables& Tables(int64_t seq, const at::Tensor& like);

  ModelOptions options_;
  c10d::ProcessGroup* tp_;
  bool first_, last_;
  at::Tensor inv_freq_;
  std::optional<RotaryTables> tables_;
  parallel::VocabParallelEmbedding embed_tokens_{nullptr};
  // This stage's layers, in order (registered under "model.layers.<index in the whole model>").
  std::vector<std::shared_ptr<torch::nn::Module>> layers_;
  RmsNorm norm_{nullptr};
  parallel::ColumnParallelLinear lm_head_{nullptr};  // untied only
};
TORCH_MODULE(Llama);

}  // namespace keel::models

#endif  // KEEL_MODELS_LLAMA_H_
