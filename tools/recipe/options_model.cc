// The model section of the trainer's options: a Hugging Face directory's config.json merged
// in, each family's fields, the sizes' values and bounds.
#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "checkpoint/hf_import.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "models/hf_config.h"
#include "models/hf_directory.h"
#include "tools/recipe/config.h"
#include "tools/recipe/internal/option_checks.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {
namespace {

// The most parameters a model may have (2^53, what a double counts exactly), far beyond any
// that trains: Keel's 64-bit counts of parameters and of their bytes then cannot overflow.
constexpr double kMaxParameters = 9007199254740992.0;

// At least as many parameters as the model of `m` holds, whatever its family and layout (every
// attention projection as wide as the widest, three MLP matrices an expert), counted in double.
double ParameterBound(const models::ModelOptions& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double width = std::max(
      h, static_cast<double>(m.num_attention_heads) * static_cast<double>(models::HeadDim(m)));
  const double experts = static_cast<double>(std::max<int64_t>(1, m.num_moe_experts));
  const double layer = 4 * h * width + 3 * h * static_cast<double>(m.ffn_hidden_size) * experts +
                       experts * h + 8 * width + 4 * h;
  const double rows = static_cast<double>(m.vocab_size) +
                      static_cast<double>(m.make_vocab_size_divisible_by) +
                      static_cast<double>(m.max_sequence_length);
  return 2 * rows * h + static_cast<double>(m.num_layers) * layer + 2 * h;
}

}  // namespace

// LoRA adapters of rank `dim` on the model of `m` count at most kMaxParameters: each adapted
// linear layer (seven a layer at most, and the output layer) gains dim x (its inputs +
// outputs), which ParameterBound / hidden_size bounds.
absl::Status CheckAdapterCount(int64_t dim, const models::ModelOptions& m) {
  const double adapters = 7 * static_cast<double>(m.num_layers) * static_cast<double>(dim) * 2 *
                          (ParameterBound(m) / static_cast<double>(m.hidden_size));
  if (adapters <= kMaxParameters) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "peft.dim (", dim, ") gives up to ", adapters,
      " adapter parameters on this model; allowed: at most 2^53 (", kMaxParameters, ")"));
}

namespace {

// A Hugging Face directory's config.json gives the family and every size it holds: a field set
// in `config` that it contradicts is an error naming both; what it does not hold (the vocabulary
// padding, the mixture of experts) stays as `config` sets it.
absl::Status ReadPretrainedConfig(const ModelConfig& config, models::ModelOptions& model) {
  const std::string& directory = config.pretrained_path();
  std::error_code error;
  if (directory.empty()) return absl::OkStatus();
  if (!std::filesystem::is_directory(directory, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.pretrained_path (", directory,
                     ") is not a directory; allowed: a Hugging Face model's directory "
                     "(config.json and safetensors files), or unset"));
  }
  if (!std::filesystem::exists(models::HfConfigPath(directory), error)) {
    // The model is `config`'s: the files' headers at least, before any data is prepared.
    return base::Annotate(checkpoint::ReadHfTensors(directory).status(), "model.pretrained_path");
  }
  KEEL_ASSIGN_OR_RETURN(const models::ModelOptions pretrained, models::ReadHfDirectory(directory));
  const base::Json ours = base::WriteJsonFields(model);
  base::Json merged = base::WriteJsonFields(pretrained);
  std::vector<const google::protobuf::FieldDescriptor*> set;
  config.GetReflection()->ListFields(config, &set);
  for (const google::protobuf::FieldDescriptor* field : set) {
    const std::string& name = field->name();
    const std::string key = models::HfKeyOf(name);
    if (key.empty() || ours.at(name) == merged.at(name)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("model.", name, " (", ours.at(name).dump(), ") contradicts ", directory,
                     "/config.json, whose ", key, " makes it ", merged.at(name).dump(),
                     "; leave model.", name, " unset to take the pretrained model's"));
  }
  for (const auto& [name, value] : ours.items()) {
    const bool padding_set =
        name == "make_vocab_size_divisible_by" && config.has_make_vocab_size_divisible_by();
    if (models::HfKeyOf(name).empty() && (name != "make_vocab_size_divisible_by" || padding_set)) {
      merged[name] = value;
    }
  }
  return base::ReadJsonFields(merged, model);
}

// The fields of one family that the other does not read are refused when set, so that no
// setting is silently ignored; then the values, as CheckModelValues.
absl::Status CheckFamilyFields(const ModelConfig& config, const models::ModelOptions& m) {
  const bool gpt = m.family == models::ModelFamily::kGpt;
  std::vector<const google::protobuf::FieldDescriptor*> set;
  config.GetReflection()->ListFields(config, &set);
  for (const google::protobuf::FieldDescriptor* field : set) {
    const std::string& name = field->name();
    const bool llama_only = field->number() >= ModelConfig::kNumQueryGroupsFieldNumber &&
                            field->number() <= ModelConfig::kWindowSizeFieldNumber;
    if (gpt && llama_only) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.", name,
                       " applies to the Llama-style families; model.family is \"gpt\" "
                       "(allowed: \"llama\", \"qwen2\", \"qwen3\", \"mistral\", or model.",
                       name, " unset)"));
    }
  }
  return CheckModelValues(m);
}

}  // namespace

absl::Status CheckModelValues(const models::ModelOptions& m) {
  for (auto [field, value] :
       {std::pair{"model.vocab_size", m.vocab_size},
        {"model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
        {"model.hidden_size", m.hidden_size},
        {"model.num_layers", m.num_layers},
        {"model.num_attention_heads", m.num_attention_heads},
        {"model.ffn_hidden_size", m.ffn_hidden_size}}) {
    KEEL_RETURN_IF_ERROR(Require(value > 0, field, value, "must be > 0"));
    KEEL_RETURN_IF_ERROR(Require(value <= kMaxCount, field, value, TooLarge()));
  }
  for (auto [field, value] : {std::pair{"model.num_query_groups", m.num_query_groups},
                              {"model.kv_channels", m.kv_channels},
                              {"model.window_size", m.window_size}}) {
    KEEL_RETURN_IF_ERROR(Require(value >= 0, field, value, "must be >= 0 (0: the default)"));
    KEEL_RETURN_IF_ERROR(Require(value <= kMaxCount, field, value, TooLarge()));
  }
  KEEL_RETURN_IF_ERROR(Require(m.num_moe_experts >= 0, "model.num_moe_experts", m.num_moe_experts,
                               "must be >= 0 (0: dense MLPs)"));
  KEEL_RETURN_IF_ERROR(Require(m.num_moe_experts <= kMaxCount, "model.num_moe_experts",
                               m.num_moe_experts, TooLarge()));
  if (const double bound = ParameterBound(m); bound > kMaxParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: hidden_size ", m.hidden_size, ", ffn_hidden_size ", m.ffn_hidden_size,
                     ", num_layers ", m.num_layers, ", vocab_size ", m.vocab_size,
                     ", num_moe_experts ", m.num_moe_experts, " give up to ", bound,
                     " parameters; allowed: at most 2^53 (", kMaxParameters, ")"));
  }
  const std::string family = models::AbslUnparseFlag(m.family);
  if (m.family == models::ModelFamily::kGpt) {
    return Require(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
                   absl::StrCat("must be divisible by model.num_attention_heads (",
                                m.num_attention_heads, ")"));
  }
  if (m.num_moe_experts != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_moe_experts (", m.num_moe_experts, ") with model.family \"", family,
                     "\": Keel's mixture of experts is the GPT's; allowed: 0"));
  }
  KEEL_RETURN_IF_ERROR(Require(
      m.num_attention_heads % models::KvHeads(m) == 0, "model.num_query_groups", m.num_query_groups,
      absl::StrCat("must divide model.num_attention_heads (", m.num_attention_heads, ")")));
  if (m.kv_channels == 0) {
    KEEL_RETURN_IF_ERROR(
        Require(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
                absl::StrCat("must be divisible by model.num_attention_heads (",
                             m.num_attention_heads, ") without model.kv_channels")));
  }
  if (models::HeadDim(m) % 2 != 0) {
    return Require(false, "model.kv_channels", models::HeadDim(m),
                   "(the width of a head) must be even: RoPE rotates pairs of dimensions");
  }
  if (!(m.rotary_base > 0) || !(m.norm_epsilon > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("model.rotary_base (", m.rotary_base,
                                                   ") and model.norm_epsilon (", m.norm_epsilon,
                                                   ") must be > 0"));
  }
  if (m.rope_scaling_factor != 0 &&
      (!(m.rope_scaling_factor > 0) || !(m.rope_high_freq_factor > m.rope_low_freq_factor) ||
       m.rope_original_max_position_embeddings < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.rope_scaling_factor (", m.rope_scaling_factor, "), rope_low_freq_factor (",
        m.rope_low_freq_factor, "), rope_high_freq_factor (", m.rope_high_freq_factor,
        ") and rope_original_max_position_embeddings (", m.rope_original_max_position_embeddings,
        "): Llama 3.1's rescaling needs factor > 0, high > low and original >= 1 (factor 0: "
        "none)"));
  }
  return absl::OkStatus();
}

absl::Status ReadModel(const TrainConfig& config, TrainOptions& options) {
  KEEL_RETURN_IF_ERROR(CopyFields(config.model(), options.model));
  KEEL_RETURN_IF_ERROR(CopyFields(config.model(), options.model.recompute));
  options.pretrained_path = config.model().pretrained_path();
  KEEL_RETURN_IF_ERROR(ReadPretrainedConfig(config.model(), options.model));
  options.model.max_sequence_length = options.data.dataset.sequence_length;
  return CheckFamilyFields(config.model(), options.model);
}

}  // namespace keel::tools::recipe
