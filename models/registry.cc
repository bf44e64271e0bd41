#include "models/registry.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace keel::models {

std::shared_ptr<LanguageModel> BuildLanguageModel(const ModelOptions& options,
                                                  const ModelGroups& groups) {
  if (options.family == ModelFamily::kGpt) return std::make_shared<GptImpl>(options, groups);
  return std::make_shared<LlamaImpl>(options, groups);
}

StageParameters CountStageParameters(const ModelOptions& options,
                                     const parallel::ModelParallelOptions& parallel,
                                     int64_t stage) {
  if (options.family == ModelFamily::kGpt) return CountGptStageParameters(options, parallel, stage);
  return CountLlamaStageParameters(options, parallel, stage);
}

std::string DescribeModel(const ModelOptions& o) {
  const int64_t parameters =
      CountStageParameters(o, {}, 0).dense + CountStageParameters(o, {}, 0).experts;
  std::string text =
      absl::StrCat(AbslUnparseFlag(o.family), ": ", o.num_layers, " layers, hidden ", o.hidden_size,
                   ", ", o.num_attention_heads, " heads of ", HeadDim(o));
  if (o.family == ModelFamily::kGpt) {
    absl::StrAppend(&text, ", GELU MLP ", o.ffn_hidden_size, ", vocabulary ", o.vocab_size,
                    " (padded to ", PaddedVocabSize(o, 1), "), learned positions up to ",
                    o.max_sequence_length, ", tied output");
    if (o.num_moe_experts > 0) {
      absl::StrAppend(&text, ", ", o.num_moe_experts, " experts (top ", o.moe_router_topk,
                      ") in every ", o.moe_layer_freq, ". block");
    }
  } else {
    absl::StrAppend(&text, " over ", KvHeads(o), " key-value groups, SwiGLU MLP ",
                    o.ffn_hidden_size, ", vocabulary ", o.vocab_size, " (padded to ",
                    PaddedVocabSize(o, 1), "), RoPE base ", o.rotary_base);
    if (o.rope_scaling_factor > 0) {
      absl::StrAppend(&text, " with llama3 scaling (factor ", o.rope_scaling_factor, ")");
    }
    if (o.window_size > 0) absl::StrAppend(&text, ", sliding window ", o.window_size);
    absl::StrAppend(&text, o.untie_embeddings_and_output_weights ? ", untied" : ", tied",
                    " output");
  }
  absl::StrAppend(&text, "; ", parameters, " parameters");
  return text;
}

}  // namespace keel::models
