#include "models/hf_config.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace keel::models {
namespace {

// ModelOptions' fields by the config.json keys they come from.
struct HfKey {
  const char* field;
  const char* key;
};
constexpr HfKey kHfKeys[] = {
    {"family", "model_type"},
    {"vocab_size", "vocab_size"},
    {"hidden_size", "hidden_size"},
    {"ffn_hidden_size", "intermediate_size"},
    {"num_layers", "num_hidden_layers"},
    {"num_attention_heads", "num_attention_heads"},
    {"num_query_groups", "num_key_value_heads"},
    {"kv_channels", "head_dim"},
    {"rotary_base", "rope_parameters.rope_theta"},
    {"rope_scaling_factor", "rope_parameters.factor"},
    {"rope_low_freq_factor", "rope_parameters.low_freq_factor"},
    {"rope_high_freq_factor", "rope_parameters.high_freq_factor"},
    {"rope_original_max_position_embeddings", "rope_parameters.original_max_position_embeddings"},
    {"norm_epsilon", "rms_norm_eps"},
    {"untie_embeddings_and_output_weights", "tie_word_embeddings"},
    {"window_size", "sliding_window"},
};

// Reads the keys of one config.json, naming the file and the key in every error.
class Keys {
 public:
  Keys(const base::Json& config, std::string source)
      : config_(config), source_(std::move(source)) {}

  bool Has(const std::string& key) const {
    return config_.contains(key) && !config_.at(key).is_null();
  }
  absl::Status Error(const std::string& key, const std::string& problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": \"", key, "\" ", problem));
  }

  // The integer at `key` (>= 1), or `fallback` when absent or null.
  absl::StatusOr<int64_t> Size(const std::string& key, std::optional<int64_t> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat(source_, ": \"", key, "\" is missing"));
    }
    const base::Json& value = config_.at(key);
    if (!value.is_number_integer()) return Mistyped(config_, key, "an integer");
    const int64_t size = value.get<int64_t>();
    if (size < 1) return Error(key, absl::StrCat("is ", size, "; it must be positive"));
    return size;
  }
  absl::StatusOr<double> Number(const base::Json& object, const std::string& key,
                                double fallback) const {
    if (!object.contains(key) || object.at(key).is_null()) return fallback;
    if (!object.at(key).is_number()) return Mistyped(object, key, "a number");
    return object.at(key).get<double>();
  }
  absl::StatusOr<bool> Flag(const std::string& key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!config_.at(key).is_boolean()) return Mistyped(config_, key, "true or false");
    return config_.at(key).get<bool>();
  }
  absl::StatusOr<std::string> Text(const base::Json& object, const std::string& key,
                                   const std::string& fallback) const {
    if (!object.contains(key) || object.at(key).is_null()) return fallback;
    if (!object.at(key).is_string()) return Mistyped(object, key, "a string");
    return object.at(key).get<std::string>();
  }
  absl::Status Mistyped(const base::Json& object, const std::string& key,
                        const std::string& wanted) const {
    return absl::DataLossError(
        absl::StrCat(source_, ": \"", key, "\" is ", object.at(key).dump(), ", not ", wanted));
  }
  const base::Json& config() const { return config_; }

 private:
  const base::Json& config_;
  std::string source_;
};

absl::StatusOr<ModelFamily> FamilyOf(const Keys& keys) {
  KEEL_ASSIGN_OR_RETURN(const std::string model_type, keys.Text(keys.config(), "model_type", ""));
  ModelFamily family;
  std::string unused;
  if (model_type == "gpt" || !AbslParseFlag(model_type, &family, &unused)) {
    return keys.Error("model_type", absl::StrCat("is \"", model_type,
                                                 "\"; Keel builds \"llama\", \"qwen2\", "
                                                 "\"qwen3\" and \"mistral\""));
  }
  return family;
}

// RoPE from transformers 5's "rope_parameters" or 4's "rope_theta" and "rope_scaling" (both may
// be present: they must then agree).
absl::Status ReadRope(const Keys& keys, ModelOptions& options) {
  const base::Json& config = keys.config();
  const base::Json empty = base::Json::object();
  const bool v5 = keys.Has("rope_parameters");
  const base::Json& block = v5 ? config.at("rope_parameters")
                               : (keys.Has("rope_scaling") ? config.at("rope_scaling") : empty);
  const std::string block_key = v5 ? "rope_parameters" : "rope_scaling";
  if (!block.is_object()) return keys.Mistyped(config, block_key, "an object");
  KEEL_ASSIGN_OR_RETURN(const double legacy_theta, keys.Number(config, "rope_theta", 10000.0));
  KEEL_ASSIGN_OR_RETURN(options.rotary_base, keys.Number(block, "rope_theta", legacy_theta));
  if (v5 && keys.Has("rope_theta") && options.rotary_base != legacy_theta) {
    return keys.Error("rope_theta", absl::StrCat("is ", legacy_theta, " but rope_parameters' is ",
                                                 options.rotary_base));
  }
  // transformers 4 spelled the type "type" in older files.
  KEEL_ASSIGN_OR_RETURN(const std::string old_type, keys.Text(block, "type", "default"));
  KEEL_ASSIGN_OR_RETURN(const std::string rope_type, keys.Text(block, "rope_type", old_type));
  KEEL_ASSIGN_OR_RETURN(const double partial, keys.Number(block, "partial_rotary_factor", 1.0));
  KEEL_ASSIGN_OR_RETURN(const double partial_top,
                        keys.Number(config, "partial_rotary_factor", partial));
  if (partial_top != 1.0) {
    return keys.Error("partial_rotary_factor",
                      absl::StrCat("is ", partial_top, "; Keel rotates whole heads (1.0)"));
  }
  if (rope_type == "default") return absl::OkStatus();
  if (rope_type != "llama3") {
    return keys.Error(
        block_key + ".rope_type",
        absl::StrCat("is \"", rope_type, "\"; Keel builds \"default\" and \"llama3\""));
  }
  KEEL_ASSIGN_OR_RETURN(options.rope_scaling_factor, keys.Number(block, "factor", 0.0));
  KEEL_ASSIGN_OR_RETURN(options.rope_low_freq_factor, keys.Number(block, "low_freq_factor", 1.0));
  KEEL_ASSIGN_OR_RETURN(options.rope_high_freq_factor, keys.Number(block, "high_freq_factor", 4.0));
  KEEL_ASSIGN_OR_RETURN(
      const double original,
      keys.Number(block, "original_max_position_embeddings",
                  static_cast<double>(options.rope_original_max_position_embeddings)));
  options.rope_original_max_position_embeddings = static_cast<int64_t>(original);
  if (options.rope_scaling_factor <= 0 ||
      options.rope_high_freq_factor <= options.rope_low_freq_factor || original < 1) {
    return keys.Error(
        block_key,
        absl::StrCat("has factor ", options.rope_scaling_factor, ", low_freq_factor ",
                     options.rope_low_freq_factor, ", high_freq_factor ",
                     options.rope_high_freq_factor, " and original_max_position_embeddings ",
                     original, "; llama3 needs factor > 0, high > low, original >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelOptions> HfConfigToOptions(const base::Json& config,
                                               const std::string& source) {
  if (!config.is_object()) return absl::DataLossError(absl::StrCat(source, " is not an object"));
  const Keys keys(config, source);
  ModelOptions options;
  options.make_vocab_size_divisible_by = 1;
  KEEL_ASSIGN_OR_RETURN(options.family, FamilyOf(keys));
  KEEL_ASSIGN_OR_RETURN(options.vocab_size, keys.Size("vocab_size", std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.hidden_size, keys.Size("hidden_size", std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.ffn_hidden_size, keys.Size("intermediate_size", std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_layers, keys.Size("num_hidden_layers", std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_attention_heads,
                        keys.Size("num_attention_heads", std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_query_groups,
                        keys.Size("num_key_value_heads", options.num_attention_heads));
  // Qwen2 has no head_dim: always hidden_size / heads.
  KEEL_ASSIGN_OR_RETURN(options.kv_channels,
                        keys.Size("head_dim", options.hidden_size / options.num_attention_heads));
  KEEL_ASSIGN_OR_RETURN(options.norm_epsilon, keys.Number(config, "rms_norm_eps", 1e-6));
  KEEL_ASSIGN_OR_RETURN(const bool tied, keys.Flag("tie_word_embeddings", false));
  options.untie_embeddings_and_output_weights = !tied;
  KEEL_ASSIGN_OR_RETURN(const std::string act, keys.Text(config, "hidden_act", "silu"));
  if (act != "silu")
    return keys.Error("hidden_act",
                      absl::StrCat("is \"", act, "\"; Keel's MLP is SwiGLU (\"silu\")"));
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    KEEL_ASSIGN_OR_RETURN(const bool on, keys.Flag(bias, false));
    if (on) return keys.Error(bias, "is true; Keel builds these layers without biases");
  }
  KEEL_RETURN_IF_ERROR(ReadRope(keys, options));
  if (options.family == ModelFamily::kMistral) {
    if (keys.Has("sliding_window")) {
      KEEL_ASSIGN_OR_RETURN(options.window_size, keys.Size("sliding_window", std::nullopt));
    }
  } else if (options.family != ModelFamily::kLlama) {
    KEEL_ASSIGN_OR_RETURN(const bool sliding, keys.Flag("use_sliding_window", false));
    if (sliding)
      return keys.Error("use_sliding_window", "is true; Keel builds Qwen's full attention only");
  }
  if (options.num_attention_heads % options.num_query_groups != 0) {
    return keys.Error("num_key_value_heads",
                      absl::StrCat("is ", options.num_query_groups,
                                   ", which does not divide num_attention_heads (",
                                   options.num_attention_heads, ")"));
  }
  return options;
}

absl::StatusOr<base::Json> OptionsToHfConfig(const ModelOptions& options, const std::string& dtype,
                                             base::Json base) {
  if (options.family == ModelFamily::kGpt || options.num_moe_experts > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.family ", AbslUnparseFlag(options.family), " with ", options.num_moe_experts,
        " experts has no Hugging Face class; config.json is written for llama, "
        "qwen2, qwen3 and mistral without experts"));
  }
  if (!base.is_object()) base = base::Json::object();
  base["model_type"] = AbslUnparseFlag(options.family);
  base["vocab_size"] = options.vocab_size;
  base["hidden_size"] = options.hidden_size;
  base["intermediate_size"] = options.ffn_hidden_size;
  base["num_hidden_layers"] = options.num_layers;
  base["num_attention_heads"] = options.num_attention_heads;
  base["num_key_value_heads"] = KvHeads(options);
  // Qwen2's class has no head_dim: it is hidden_size / heads unless a file says otherwise.
  if (options.family != ModelFamily::kQwen2 ||
      HeadDim(options) != options.hidden_size / options.num_attention_heads) {
    base["head_dim"] = HeadDim(options);
  }
  base["hidden_act"] = "silu";
  base["rms_norm_eps"] = options.norm_epsilon;
  base["tie_word_embeddings"] = !options.untie_embeddings_and_output_weights;
  base["dtype"] = dtype;
  if (!base.contains("max_position_embeddings")) {
    base["max_position_embeddings"] = options.max_sequence_length;
  }
  base::Json rope = {{"rope_theta", options.rotary_base}, {"rope_type", "default"}};
  if (options.rope_scaling_factor > 0) {
    rope["rope_type"] = "llama3";
    rope["factor"] = options.rope_scaling_factor;
    rope["low_freq_factor"] = options.rope_low_freq_factor;
    rope["high_freq_factor"] = options.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = options.rope_original_max_position_embeddings;
  }
  base["rope_parameters"] = std::move(rope);
  base.erase("rope_theta");  // transformers 4's spelling, replaced by rope_parameters
  base.erase("rope_scaling");
  switch (options.family) {
    case ModelFamily::kLlama:
      base["architectures"] = {"LlamaForCausalLM"};
      base["attention_bias"] = false;
      base["mlp_bias"] = false;
      break;
    case ModelFamily::kMistral:
      base["architectures"] = {"MistralForCausalLM"};
      base["sliding_window"] =
          options.window_size > 0 ? base::Json(options.window_size) : base::Json(nullptr);
      break;
    case ModelFamily::kQwen2:  // full attention in every layer, as Keel builds Qwen
    case ModelFamily::kQwen3:
      base["architectures"] = {options.family == ModelFamily::kQwen2 ? "Qwen2ForCausalLM"
                                                                     : "Qwen3ForCausalLM"};
      base["use_sliding_window"] = false;
      break;
    case ModelFamily::kGpt:
      break;  // refused above
  }
  // A base of another depth has per-layer types that no longer fit: transformers derives them.
  if (base.contains("layer_types") &&
      (!base["layer_types"].is_array() ||
       base["layer_types"].size() != static_cast<size_t>(options.num_layers))) {
    base.erase("layer_types");
  }
  return base;
}

std::map<std::string, int64_t> HfVocabRows(const ModelOptions& options) {
  std::map<std::string, int64_t> rows = {{kHfEmbeddingWeight, options.vocab_size}};
  if (options.untie_embeddings_and_output_weights) rows[kHfOutputWeight] = options.vocab_size;
  return rows;
}

std::string HfKeyOf(const std::string& field) {
  for (const HfKey& entry : kHfKeys) {
    if (field == entry.field) return entry.key;
  }
  return "";
}

absl::StatusOr<ModelOptions> ReadHfConfig(const std::string& directory) {
  const std::string path = directory + "/config.json";
  KEEL_ASSIGN_OR_RETURN(const base::Json config, base::ReadJsonFile(path));
  return HfConfigToOptions(config, path);
}

}  // namespace keel::models
