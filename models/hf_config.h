// A Hugging Face config.json of the Llama layout (model_type "llama", "qwen2", "qwen3",
// "mistral") as ModelOptions: HF's names onto Megatron's (num_hidden_layers -> num_layers,
// intermediate_size -> ffn_hidden_size, num_key_value_heads -> num_query_groups, head_dim ->
// kv_channels, rms_norm_eps -> norm_epsilon, tie_word_embeddings -> the negation of
// untie_embeddings_and_output_weights, sliding_window -> window_size), RoPE from either spelling
// (transformers 5's "rope_parameters", or 4's "rope_theta" with "rope_scaling"), and each
// class's defaults for the keys a file leaves out. What Keel does not build is refused by name
// rather than approximated. The way back: the config.json of a model Keel trained, and the
// tensors whose vocabulary Hugging Face holds unpadded.
//
//   KEEL_ASSIGN_OR_RETURN(ModelOptions options, ReadHfConfig("/models/llama-3.2-1b"));
//   KEEL_ASSIGN_OR_RETURN(base::Json config, OptionsToHfConfig(options, "bfloat16", {}));
#ifndef KEEL_MODELS_HF_CONFIG_H_
#define KEEL_MODELS_HF_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "base/json.h"
#include "models/model_options.h"

namespace keel::models {

// The Hugging Face names of the word embedding and of an untied output layer (the Llama-style
// families use HF's names for every tensor).
inline constexpr char kHfEmbeddingWeight[] = "model.embed_tokens.weight";
inline constexpr char kHfOutputWeight[] = "lm_head.weight";

// The options of the model that `directory`/config.json describes; the fields config.json
// does not determine keep ModelOptions' defaults, but make_vocab_size_divisible_by, which is 1
// (the vocabulary padded only to the tensor-parallel size: HF's tensors are unpadded).
// Errors: kNotFound for a missing file; kDataLoss for a file that is not a JSON object or a key
// of the wrong type (null where transformers needs a number is one); kInvalidArgument naming
// the key for what Keel does not build (another model_type, a hidden_act other than "silu",
// attention or MLP biases in Llama, a rope_type other than "default" and "llama3", partial
// rotary dimensions, Qwen's use_sliding_window, the two RoPE spellings disagreeing), for what
// transformers does not load either (llama3 RoPE without its factors), or for sizes that are
// not positive.
[[nodiscard]] absl::StatusOr<ModelOptions> ReadHfConfig(const std::string& directory);

// "<directory>/config.json": the file that makes a directory a Hugging Face model's.
std::string HfConfigPath(const std::string& directory);

// The config.json of the Llama-style model `options` describes, with its floating-point
// tensors in `dtype` ("float32" or "bfloat16"): `base` (the config.json of the model a
// fine-tune started from, whose other keys, such as token ids, are kept; an empty object for
// none) with every key that ModelOptions determines set (architectures, model_type, the sizes,
// RoPE in transformers 5's "rope_parameters", the norm's epsilon, tying, the window; "dtype";
// "max_position_embeddings" when `base` lacks it: max_sequence_length). HfConfigToOptions of
// the result gives `options` back, make_vocab_size_divisible_by aside. Errors:
// kInvalidArgument for the GPT family (no Hugging Face class has its layout) or experts.
[[nodiscard]] absl::StatusOr<base::Json> OptionsToHfConfig(const ModelOptions& options,
                                                           const std::string& dtype,
                                                           base::Json base);

// The tensors whose rows are the vocabulary, by name -> vocab_size: Hugging Face holds them
// without the padding rows Keel adds for tensor parallelism.
std::map<std::string, int64_t> HfVocabRows(const ModelOptions& options);

// The config.json key each ModelOptions field comes from ("rope_parameters.factor" for a key of
// the RoPE block), for messages that name both; empty for a field config.json does not set.
std::string HfKeyOf(const std::string& field);

// What ReadHfConfig reads from an already parsed config.json; `source` names it in errors.
[[nodiscard]] absl::StatusOr<ModelOptions> HfConfigToOptions(const base::Json& config,
                                                             const std::string& source);

}  // namespace keel::models

#endif  // KEEL_MODELS_HF_CONFIG_H_
