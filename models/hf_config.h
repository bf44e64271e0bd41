// A Hugging Face config.json of the Llama layout (model_type "llama", "qwen2", "qwen3",
// "mistral") as ModelOptions: HF's names onto Megatron's (num_hidden_layers -> num_layers,
// intermediate_size -> ffn_hidden_size, num_key_value_heads -> num_query_groups, head_dim ->
// kv_channels, rms_norm_eps -> norm_epsilon, tie_word_embeddings -> the negation of
// untie_embeddings_and_output_weights, sliding_window -> window_size), RoPE from either spelling
// (transformers 5's "rope_parameters", or 4's "rope_theta" with "rope_scaling"), and each
// class's defaults for the keys a file leaves out. What Keel does not build is refused by name
// rather than approximated.
//
//   KEEL_ASSIGN_OR_RETURN(ModelOptions options, ReadHfConfig("/models/llama-3.2-1b"));
#ifndef KEEL_MODELS_HF_CONFIG_H_
#define KEEL_MODELS_HF_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "base/json.h"
#include "models/model_options.h"

namespace keel::models {

// The options of the model that `directory`/config.json describes; the fields config.json
// does not determine keep ModelOptions' defaults, but make_vocab_size_divisible_by, which is 1
// (the vocabulary padded only to the tensor-parallel size: HF's tensors are unpadded).
// Errors: kNotFound for a missing file; kDataLoss for a file that is not a JSON object or a key
// of the wrong type; kInvalidArgument naming the key for what Keel does not build (another
// model_type, a hidden_act other than "silu", attention or MLP biases in Llama, a rope_type
// other than "default" and "llama3", partial rotary dimensions, Qwen's use_sliding_window,
// the two RoPE spellings disagreeing) or for sizes that are not positive.
[[nodiscard]] absl::StatusOr<ModelOptions> ReadHfConfig(const std::string& directory);

// The config.json key each ModelOptions field comes from ("rope_parameters.factor" for a key of
// the RoPE block), for messages that name both; empty for a field config.json does not set.
std::string HfKeyOf(const std::string& field);

// What ReadHfConfig reads from an already parsed config.json; `source` names it in errors.
[[nodiscard]] absl::StatusOr<ModelOptions> HfConfigToOptions(const base::Json& config,
                                                             const std::string& source);

}  // namespace keel::models

#endif  // KEEL_MODELS_HF_CONFIG_H_
