#include "models/hf_config.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/quote.h"
#include "base/status.h"

namespace keel::models {
namespace {

// config.json's keys (transformers' names).
constexpr char kModelType[] = "model_type";
constexpr char kVocabSize[] = "vocab_size";
constexpr char kHiddenSize[] = "hidden_size";
constexpr char kIntermediateSize[] = "intermediate_size";
constexpr char kNumHiddenLayers[] = "num_hidden_layers";
constexpr char kNumAttentionHeads[] = "num_attention_heads";
constexpr char kNumKeyValueHeads[] = "num_key_value_heads";
constexpr char kHeadDim[] = "head_dim";
constexpr char kRopeParameters[] = "rope_parameters";
constexpr char kRopeScaling[] = "rope_scaling";
constexpr char kRopeTheta[] = "rope_theta";
constexpr char kRopeType[] = "rope_type";
constexpr char kFactor[] = "factor";
constexpr char kLowFreqFactor[] = "low_freq_factor";
constexpr char kHighFreqFactor[] = "high_freq_factor";
constexpr char kOriginalMaxPositionEmbeddings[] = "original_max_position_embeddings";
constexpr char kRmsNormEps[] = "rms_norm_eps";
constexpr char kTieWordEmbeddings[] = "tie_word_embeddings";
constexpr char kSlidingWindow[] = "sliding_window";
constexpr char kUseSlidingWindow[] = "use_sliding_window";
constexpr char kHiddenAct[] = "hidden_act";
constexpr char kAttentionBias[] = "attention_bias";
constexpr char kMlpBias[] = "mlp_bias";
constexpr char kPartialRotaryFactor[] = "partial_rotary_factor";
constexpr char kMaxPositionEmbeddings[] = "max_position_embeddings";
constexpr char kArchitectures[] = "architectures";
constexpr char kDtype[] = "dtype";
constexpr char kLayerTypes[] = "layer_types";
// transformers' MistralConfig.sliding_window when config.json has no such key.
constexpr int64_t kMistralDefaultWindow = 4096;
// The values Keel builds of "rope_type" and "hidden_act".
constexpr char kDefaultRope[] = "default";
constexpr char kLlama3Rope[] = "llama3";
constexpr char kSilu[] = "silu";

// ModelOptions' fields by the config.json keys they come from (`block`: the object holding the
// key, none for the top level).
struct HfKey {
  const char* field;
  const char* key;
  const char* block = nullptr;
};
constexpr HfKey kHfKeys[] = {
    {"family", kModelType},
    {"vocab_size", kVocabSize},
    {"hidden_size", kHiddenSize},
    {"ffn_hidden_size", kIntermediateSize},
    {"num_layers", kNumHiddenLayers},
    {"num_attention_heads", kNumAttentionHeads},
    {"num_query_groups", kNumKeyValueHeads},
    {"kv_channels", kHeadDim},
    {"rotary_base", kRopeTheta, kRopeParameters},
    {"rope_scaling_factor", kFactor, kRopeParameters},
    {"rope_low_freq_factor", kLowFreqFactor, kRopeParameters},
    {"rope_high_freq_factor", kHighFreqFactor, kRopeParameters},
    {"rope_original_max_position_embeddings", kOriginalMaxPositionEmbeddings, kRopeParameters},
    {"norm_epsilon", kRmsNormEps},
    {"untie_embeddings_and_output_weights", kTieWordEmbeddings},
    {"window_size", kSlidingWindow},
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

  // The integer at `key` (in [1, kMaxSize]), or `fallback` when absent or null.
  absl::StatusOr<int64_t> Size(const std::string& key, std::optional<int64_t> fallback) const {
    if (!Has(key)) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat(source_, ": \"", key, "\" is missing"));
    }
    const base::Json& value = config_.at(key);
    if (!value.is_number_integer()) return Mistyped(config_, key, "an integer");
    // Compared as read: get<int64_t>() would wrap an unsigned past 2^63 - 1 to a negative.
    if (value.is_number_unsigned() ? value.get<uint64_t>() > static_cast<uint64_t>(kMaxSize)
                                   : value.get<int64_t>() > kMaxSize) {
      return Error(key, absl::StrCat("is ", value.dump(), "; it must be at most ", kMaxSize,
                                     " (the largest size a model takes)"));
    }
    const int64_t size = value.get<int64_t>();
    if (size < 1) return Error(key, absl::StrCat("is ", size, "; it must be positive"));
    return size;
  }
  // The number at `key` of `object`, `fallback` when absent. null is refused, as transformers
  // refuses it (None where its classes compute with a float).
  absl::StatusOr<double> Number(const base::Json& object, const std::string& key,
                                double fallback) const {
    if (!object.contains(key)) return fallback;
    if (!object.at(key).is_number()) return Mistyped(object, key, "a number");
    return object.at(key).get<double>();
  }
  // As Number, but null too is `fallback` (transformers' partial_rotary_factor).
  absl::StatusOr<double> NumberOrNull(const base::Json& object, const std::string& key,
                                      double fallback) const {
    if (object.contains(key) && object.at(key).is_null()) return fallback;
    return Number(object, key, fallback);
  }
  // The number at `key` of `object` (`fallback` when absent), which must be > 0 and finite.
  absl::StatusOr<double> Positive(const base::Json& object, const std::string& key,
                                  double fallback) const {
    KEEL_ASSIGN_OR_RETURN(const double value, Number(object, key, fallback));
    if (!(value > 0) || !std::isfinite(value)) {
      return Error(key, absl::StrCat("is ", value, "; it must be a positive finite number"));
    }
    return value;
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
    return absl::DataLossError(absl::StrCat(source_, ": \"", key, "\" is ",
                                            base::Excerpt(object.at(key)), ", not ", wanted));
  }
  const base::Json& config() const { return config_; }

 private:
  const base::Json& config_;
  std::string source_;
};

absl::StatusOr<ModelFamily> FamilyOf(const Keys& keys) {
  KEEL_ASSIGN_OR_RETURN(const std::string model_type, keys.Text(keys.config(), kModelType, ""));
  ModelFamily family;
  std::string unused;
  if (model_type == "gpt" || !AbslParseFlag(model_type, &family, &unused)) {
    return keys.Error(kModelType, absl::StrCat("is \"", model_type,
                                               "\"; Keel builds \"llama\", \"qwen2\", "
                                               "\"qwen3\" and \"mistral\""));
  }
  return family;
}

// max_position_embeddings of each family's transformers class, for a file without the key.
int64_t ClassMaxPositions(ModelFamily family) {
  switch (family) {
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      return 32768;
    case ModelFamily::kMistral:
      return 131072;
    case ModelFamily::kLlama:
    case ModelFamily::kGpt:  // has no config.json; FamilyOf refuses it first
      break;
  }
  return 2048;  // LlamaConfig's
}

// RoPE from transformers 5's "rope_parameters" or 4's "rope_theta" and "rope_scaling" (both may
// be present: they must then agree).
absl::Status ReadRope(const Keys& keys, ModelOptions& options) {
  const base::Json& config = keys.config();
  const base::Json empty = base::Json::object();
  const bool v5 = keys.Has(kRopeParameters);
  const base::Json& block =
      v5 ? config.at(kRopeParameters) : (keys.Has(kRopeScaling) ? config.at(kRopeScaling) : empty);
  const std::string block_key = v5 ? kRopeParameters : kRopeScaling;
  if (!block.is_object()) return keys.Mistyped(config, block_key, "an object");
  KEEL_ASSIGN_OR_RETURN(const double legacy_theta, keys.Positive(config, kRopeTheta, 10000.0));
  KEEL_ASSIGN_OR_RETURN(options.rotary_base, keys.Positive(block, kRopeTheta, legacy_theta));
  if (v5 && keys.Has(kRopeTheta) && options.rotary_base != legacy_theta) {
    return keys.Error(kRopeTheta, absl::StrCat("is ", legacy_theta, " but rope_parameters' is ",
                                               options.rotary_base));
  }
  // transformers 4 spelled the type "type" in older files.
  KEEL_ASSIGN_OR_RETURN(const std::string old_type, keys.Text(block, "type", kDefaultRope));
  KEEL_ASSIGN_OR_RETURN(const std::string rope_type, keys.Text(block, kRopeType, old_type));
  KEEL_ASSIGN_OR_RETURN(const double partial, keys.NumberOrNull(block, kPartialRotaryFactor, 1.0));
  KEEL_ASSIGN_OR_RETURN(const double partial_top,
                        keys.NumberOrNull(config, kPartialRotaryFactor, partial));
  if (partial_top != 1.0) {
    return keys.Error(kPartialRotaryFactor,
                      absl::StrCat("is ", partial_top, "; Keel rotates whole heads (1.0)"));
  }
  if (rope_type == kDefaultRope) return absl::OkStatus();
  if (rope_type != kLlama3Rope) {
    return keys.Error(
        absl::StrCat(block_key, ".", kRopeType),
        absl::StrCat("is \"", rope_type, "\"; Keel builds \"default\" and \"llama3\""));
  }
  // transformers' llama3 checks (modeling_rope_utils.py): the three factors present (a file
  // without one, or with null, does not load there), every factor positive, high > low; without
  // original_max_position_embeddings, max_position_embeddings (the class's default if absent).
  const auto required = [&](const char* key) -> absl::StatusOr<double> {
    if (!block.contains(key)) {
      return keys.Error(absl::StrCat(block_key, ".", key),
                        "is missing; llama3 RoPE needs it (transformers refuses the file too)");
    }
    return keys.Number(block, key, 0.0);
  };
  KEEL_ASSIGN_OR_RETURN(options.rope_scaling_factor, required(kFactor));
  KEEL_ASSIGN_OR_RETURN(options.rope_low_freq_factor, required(kLowFreqFactor));
  KEEL_ASSIGN_OR_RETURN(options.rope_high_freq_factor, required(kHighFreqFactor));
  KEEL_ASSIGN_OR_RETURN(const double max_positions,
                        keys.Number(config, kMaxPositionEmbeddings,
                                    static_cast<double>(ClassMaxPositions(options.family))));
  KEEL_ASSIGN_OR_RETURN(const double original,
                        keys.Number(block, kOriginalMaxPositionEmbeddings, max_positions));
  // Positions are int64 (a double past 2^53 is no longer a whole number of positions): the
  // range is checked before the conversion.
  constexpr double kMostPositions = 9007199254740992.0;  // 2^53
  if (!(options.rope_scaling_factor > 0) || !std::isfinite(options.rope_scaling_factor) ||
      !(options.rope_low_freq_factor > 0) ||
      !(options.rope_high_freq_factor > options.rope_low_freq_factor) ||
      !std::isfinite(options.rope_high_freq_factor) || !(original >= 1) ||
      !(original <= kMostPositions) || original != std::floor(original)) {
    return keys.Error(
        block_key,
        absl::StrCat("has factor ", options.rope_scaling_factor, ", low_freq_factor ",
                     options.rope_low_freq_factor, ", high_freq_factor ",
                     options.rope_high_freq_factor, " and original_max_position_embeddings ",
                     original,
                     "; llama3 needs factor > 0, low_freq_factor > 0, high_freq_factor > "
                     "low_freq_factor (all finite) and original_max_position_embeddings a whole "
                     "number from 1 to 2^53"));
  }
  options.rope_original_max_position_embeddings = static_cast<int64_t>(original);
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
  KEEL_ASSIGN_OR_RETURN(options.vocab_size, keys.Size(kVocabSize, std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.hidden_size, keys.Size(kHiddenSize, std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.ffn_hidden_size, keys.Size(kIntermediateSize, std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_layers, keys.Size(kNumHiddenLayers, std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_attention_heads, keys.Size(kNumAttentionHeads, std::nullopt));
  KEEL_ASSIGN_OR_RETURN(options.num_query_groups,
                        keys.Size(kNumKeyValueHeads, options.num_attention_heads));
  // Without head_dim, each family's class default: Qwen3's is 128, the others' hidden_size //
  // num_attention_heads (Qwen2's class has no head_dim at all).
  const int64_t default_head_dim = options.family == ModelFamily::kQwen3
                                       ? 128
                                       : options.hidden_size / options.num_attention_heads;
  if (!keys.Has(kHeadDim) && default_head_dim < 1) {
    return keys.Error(kHeadDim,
                      absl::StrCat("is missing, and hidden_size (", options.hidden_size,
                                   ") // num_attention_heads (", options.num_attention_heads,
                                   ") is 0: a head needs a width of at least 1"));
  }
  KEEL_ASSIGN_OR_RETURN(options.kv_channels, keys.Size(kHeadDim, default_head_dim));
  KEEL_ASSIGN_OR_RETURN(options.norm_epsilon, keys.Positive(config, kRmsNormEps, 1e-6));
  KEEL_ASSIGN_OR_RETURN(const bool tied, keys.Flag(kTieWordEmbeddings, false));
  options.untie_embeddings_and_output_weights = !tied;
  KEEL_ASSIGN_OR_RETURN(const std::string act, keys.Text(config, kHiddenAct, kSilu));
  if (act != kSilu)
    return keys.Error(kHiddenAct,
                      absl::StrCat("is \"", act, "\"; Keel's MLP is SwiGLU (\"silu\")"));
  for (const char* bias : {kAttentionBias, kMlpBias}) {
    KEEL_ASSIGN_OR_RETURN(const bool on, keys.Flag(bias, false));
    if (on) return keys.Error(bias, "is true; Keel builds these layers without biases");
  }
  KEEL_RETURN_IF_ERROR(ReadRope(keys, options));
  if (options.family == ModelFamily::kMistral) {
    // MistralConfig's default window is 4096 when the key is absent; null means none.
    if (!config.contains(kSlidingWindow)) {
      options.window_size = kMistralDefaultWindow;
    } else if (keys.Has(kSlidingWindow)) {
      KEEL_ASSIGN_OR_RETURN(options.window_size, keys.Size(kSlidingWindow, std::nullopt));
    }
  } else if (options.family != ModelFamily::kLlama) {
    KEEL_ASSIGN_OR_RETURN(const bool sliding, keys.Flag(kUseSlidingWindow, false));
    if (sliding)
      return keys.Error(kUseSlidingWindow, "is true; Keel builds Qwen's full attention only");
  }
  if (options.num_attention_heads % options.num_query_groups != 0) {
    return keys.Error(kNumKeyValueHeads,
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
  base[kModelType] = AbslUnparseFlag(options.family);
  base[kVocabSize] = options.vocab_size;
  base[kHiddenSize] = options.hidden_size;
  base[kIntermediateSize] = options.ffn_hidden_size;
  base[kNumHiddenLayers] = options.num_layers;
  base[kNumAttentionHeads] = options.num_attention_heads;
  base[kNumKeyValueHeads] = KvHeads(options);
  // Qwen2's class has no head_dim: it is hidden_size / heads unless a file says otherwise.
  if (options.family != ModelFamily::kQwen2 ||
      HeadDim(options) != options.hidden_size / options.num_attention_heads) {
    base[kHeadDim] = HeadDim(options);
  }
  base[kHiddenAct] = kSilu;
  base[kRmsNormEps] = options.norm_epsilon;
  base[kTieWordEmbeddings] = !options.untie_embeddings_and_output_weights;
  base[kDtype] = dtype;
  if (!base.contains(kMaxPositionEmbeddings)) {
    base[kMaxPositionEmbeddings] = options.max_sequence_length;
  }
  base::Json rope = {{kRopeTheta, options.rotary_base}, {kRopeType, kDefaultRope}};
  if (options.rope_scaling_factor > 0) {
    rope[kRopeType] = kLlama3Rope;
    rope[kFactor] = options.rope_scaling_factor;
    rope[kLowFreqFactor] = options.rope_low_freq_factor;
    rope[kHighFreqFactor] = options.rope_high_freq_factor;
    rope[kOriginalMaxPositionEmbeddings] = options.rope_original_max_position_embeddings;
  }
  base[kRopeParameters] = std::move(rope);
  base.erase(kRopeTheta);  // transformers 4's spelling, replaced by rope_parameters
  base.erase(kRopeScaling);
  switch (options.family) {
    case ModelFamily::kLlama:
      base[kArchitectures] = {"LlamaForCausalLM"};
      base[kAttentionBias] = false;
      base[kMlpBias] = false;
      break;
    case ModelFamily::kMistral:
      base[kArchitectures] = {"MistralForCausalLM"};
      base[kSlidingWindow] =
          options.window_size > 0 ? base::Json(options.window_size) : base::Json(nullptr);
      break;
    case ModelFamily::kQwen2:  // full attention in every layer, as Keel builds Qwen
    case ModelFamily::kQwen3:
      base[kArchitectures] = {options.family == ModelFamily::kQwen2 ? "Qwen2ForCausalLM"
                                                                    : "Qwen3ForCausalLM"};
      base[kUseSlidingWindow] = false;
      break;
    case ModelFamily::kGpt:
      break;  // refused above
  }
  // A base of another depth has per-layer types that no longer fit: transformers derives them.
  if (base.contains(kLayerTypes) &&
      (!base[kLayerTypes].is_array() ||
       base[kLayerTypes].size() != static_cast<size_t>(options.num_layers))) {
    base.erase(kLayerTypes);
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
    if (field == entry.field) {
      return entry.block == nullptr ? entry.key : absl::StrCat(entry.block, ".", entry.key);
    }
  }
  return "";
}

std::string HfConfigPath(const std::string& directory) { return directory + "/config.json"; }

absl::StatusOr<ModelOptions> ReadHfConfig(const std::string& directory) {
  const std::string path = HfConfigPath(directory);
  KEEL_ASSIGN_OR_RETURN(const base::Json config, base::ReadJsonFile(path));
  return HfConfigToOptions(config, path);
}

}  // namespace keel::models
