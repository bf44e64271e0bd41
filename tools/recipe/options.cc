#include "tools/recipe/options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/enum.h"
#include "base/files.h"
#include "base/status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "models/hf_config.h"
#include "models/hf_directory.h"
#include "peft/peft_format.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/numpy_random.h"
#include "tools/recipe/config.h"

namespace keel::tools::recipe {
namespace {

// `field` (`value`) `allowed`, unless ok. `value` an integer or a double.
template <typename Number>
absl::Status Require(bool ok, absl::string_view field, Number value, absl::string_view allowed) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " (", value, ") ", allowed));
}

// The largest size or count a configuration takes: a model's largest size, which keeps
// products of a few of them exact in 64 bits.
constexpr int64_t kMaxCount = models::kMaxSize;

// The most parameters a model may have (2^53, what a double counts exactly), far beyond any
// that trains: Keel's 64-bit counts of parameters and of their bytes then cannot overflow.
constexpr double kMaxParameters = 9007199254740992.0;

std::string TooLarge() {
  return absl::StrCat("is beyond ", kMaxCount,
                      ", the largest size or count a configuration takes (Keel's products of a "
                      "few of them stay exact in 64 bits)");
}

// Every integer set in `config`'s sections, seeds aside, at most kMaxCount. The fields' own
// checks refuse what is too small.
absl::Status CheckCounts(const TrainConfig& config) {
  std::vector<const google::protobuf::FieldDescriptor*> sections;
  config.GetReflection()->ListFields(config, &sections);
  for (const google::protobuf::FieldDescriptor* section : sections) {
    if (section->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) continue;
    const google::protobuf::Message& message = config.GetReflection()->GetMessage(config, section);
    std::vector<const google::protobuf::FieldDescriptor*> set;
    message.GetReflection()->ListFields(message, &set);
    for (const google::protobuf::FieldDescriptor* field : set) {
      if (field->is_repeated() || absl::StrContains(field->name(), "seed")) continue;
      int64_t value = 0;
      if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
        value = message.GetReflection()->GetInt64(message, field);
      } else if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32) {
        value = message.GetReflection()->GetInt32(message, field);
      }
      KEEL_RETURN_IF_ERROR(Require(value <= kMaxCount,
                                   absl::StrCat(section->name(), ".", field->name()), value,
                                   TooLarge()));
    }
  }
  return absl::OkStatus();
}

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

namespace {

absl::Status ReadModel(const TrainConfig& config, TrainOptions& options) {
  KEEL_RETURN_IF_ERROR(CopyFields(config.model(), options.model));
  KEEL_RETURN_IF_ERROR(CopyFields(config.model(), options.model.recompute));
  options.pretrained_path = config.model().pretrained_path();
  KEEL_RETURN_IF_ERROR(ReadPretrainedConfig(config.model(), options.model));
  options.model.max_sequence_length = options.data.dataset.sequence_length;
  return CheckFamilyFields(config.model(), options.model);
}

absl::Status ReadOptimizer(const OptimizerConfig& config, OptimizerOptions& options) {
  if (config.has_name() && config.name() != "AdamW") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.name \"", config.name(),
                                                   "\" is not supported; allowed: \"AdamW\""));
  }
  if (config.has_lr()) options.lr = config.lr();
  if (config.has_beta1()) options.beta1 = config.beta1();
  if (config.has_beta2()) options.beta2 = config.beta2();
  if (config.has_eps()) options.eps = config.eps();
  if (config.has_weight_decay()) options.weight_decay = config.weight_decay();
  if (config.has_fused()) options.fused = config.fused();
  // torch.optim.AdamW's checks, before any step (and in the dry run), written so that NaN fails
  // them; an infinite rate, epsilon or decay trains nothing either.
  for (const auto& [field, value] : {std::pair{"optimizer.lr", options.lr},
                                     {"optimizer.eps", options.eps},
                                     {"optimizer.weight_decay", options.weight_decay}}) {
    KEEL_RETURN_IF_ERROR(
        Require(value >= 0 && std::isfinite(value), field, value, "must be a finite number >= 0"));
  }
  for (const auto& [field, value] :
       {std::pair{"optimizer.beta1", options.beta1}, {"optimizer.beta2", options.beta2}}) {
    KEEL_RETURN_IF_ERROR(Require(value >= 0 && value < 1, field, value, "must be in [0, 1)"));
  }
  return absl::OkStatus();
}

// Model-parallel sizes the trainer cannot build a model for yet; the layout itself (groups,
// checkpoints, the data-parallel coordinates) is general.
absl::Status RefuseModelParallelism(const parallel::ModelParallelOptions& p) {
  for (const auto& [field, size] :
       {std::pair{"virtual_pipeline_model_parallel_size", p.virtual_pipeline_model_parallel_size},
        {"context_parallel_size", std::optional(p.context_parallel_size)}}) {
    if (size.value_or(1) == 1) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.", field, " (", *size,
        "): the trainer's model runs data-, tensor-, pipeline- and expert-parallel only for now; "
        "allowed: 1"));
  }
  const int64_t tp = p.tensor_model_parallel_size;
  if (p.expert_tensor_parallel_size.value_or(tp) != tp) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.expert_tensor_parallel_size (", *p.expert_tensor_parallel_size,
                     "): the trainer's experts split as its MLPs do; allowed: unset or "
                     "tensor_model_parallel_size (",
                     tp, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadDistributed(const DistributedConfig& config, DistributedOptions& options) {
  std::string error;
  if (config.has_backend() && !AbslParseFlag(config.backend(), &options.backend, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("distributed.backend ", error));
  }
  KEEL_RETURN_IF_ERROR(CopyFields(config, options, {"backend"}));
  KEEL_RETURN_IF_ERROR(Require(options.timeout_seconds > 0, "distributed.timeout_seconds",
                               options.timeout_seconds, "must be > 0"));
  if (options.hang_timeout_seconds.has_value()) {
    KEEL_RETURN_IF_ERROR(Require(*options.hang_timeout_seconds >= 0,
                                 "distributed.hang_timeout_seconds", *options.hang_timeout_seconds,
                                 "must be >= 0 (0: off)"));
  }
  return RefuseModelParallelism(options.parallel);
}

absl::Status ReadLogging(const LoggingConfig& config, LoggingOptions& options) {
  KEEL_RETURN_IF_ERROR(CopyFields(config, options));
  KEEL_RETURN_IF_ERROR(Require(options.log_every_steps > 0, "logging.log_every_steps",
                               options.log_every_steps, "must be > 0"));
  KEEL_RETURN_IF_ERROR(Require(options.profile_steps >= 0, "logging.profile_steps",
                               options.profile_steps, "must be >= 0 (0: no profile)"));
  KEEL_RETURN_IF_ERROR(Require(options.profile_after_step >= 0, "logging.profile_after_step",
                               options.profile_after_step, "must be >= 0"));
  return absl::OkStatus();
}

constexpr base::EnumSpelling<NonFinitePolicy> kNonFinitePolicies[] = {
    {NonFinitePolicy::kStop, "stop"}, {NonFinitePolicy::kSkip, "skip"}};

absl::Status ReadNumerics(const NumericsConfig& config, NumericsOptions& options) {
  KEEL_RETURN_IF_ERROR(CopyFields(config, options));
  return Require(options.max_consecutive_skipped_steps > 0,
                 "numerics.max_consecutive_skipped_steps", options.max_consecutive_skipped_steps,
                 "must be > 0");
}

// data.paths, data.split and data.seed as Megatron's builder will read them.
absl::Status CheckMegatronData(const TrainOptions& options) {
  const DataOptions& data = options.data;
  if (!data.prefix.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data.paths (\"", data.megatron.paths,
                                                   "\") and data.prefix (\"", data.prefix,
                                                   "\") are exclusive; set one"));
  }
  KEEL_RETURN_IF_ERROR(Require(data.validation_every_n_samples == 0,
                               "data.validation_every_n_samples", data.validation_every_n_samples,
                               "must be 0 with data.paths (validation comes from data.split)"));
  if (!options.step_scheduler.max_steps.has_value()) {
    return absl::InvalidArgumentError(
        "data.paths sizes the training split as step_scheduler.max_steps x global_batch_size: "
        "set step_scheduler.max_steps");
  }
  const std::vector<std::string> items =
      absl::StrSplit(data.megatron.paths, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  absl::StatusOr<sampling::Blend> blend = sampling::GetBlendFromList(items);
  KEEL_RETURN_IF_ERROR(base::Annotate(blend.status(), "data.paths"));
  for (size_t i = 0; blend->weights.has_value() && i < blend->prefixes.size(); ++i) {
    const double w = (*blend->weights)[i];
    if (!(w > 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(absl::StrCat("data.paths: the weight of ",
                                                     blend->prefixes[i], " (", w,
                                                     ") must be a positive number"));
    }
  }
  KEEL_RETURN_IF_ERROR(
      base::Annotate(sampling::ParseAndNormalizeSplit(data.megatron.split).status(), "data.split"));
  return base::Annotate(sampling::NumpyRandomState::Create(data.megatron.seed).status(),
                        "data.seed");
}

absl::Status ReadData(const DataConfig& config, DataOptions& options) {
  options.prefix = config.prefix();
  KEEL_RETURN_IF_ERROR(CopyFields(config, options.dataset));
  KEEL_RETURN_IF_ERROR(CopyFields(config, options.megatron));
  KEEL_RETURN_IF_ERROR(CopyFields(config, options.sft));
  // Megatron's seq_length has no default: the model's positions and every sample's length.
  KEEL_RETURN_IF_ERROR(Require(options.dataset.sequence_length > 1, "data.sequence_length",
                               options.dataset.sequence_length,
                               "must be > 1 (the tokens a sample trains on)"));
  if (options.sft.format == DataFormat::kSft &&
      (options.prefix.empty() || !config.paths().empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.format \"sft\" trains on the conversations at data.prefix (",
        options.prefix.empty() ? "unset" : options.prefix,
        ") that tools/scripts/hf_sft_tokenize.py writes; allowed: data.prefix set, data.paths "
        "unset"));
  }
  // Unset: every 20th window validates, or with data.paths none (data.split's validation).
  options.validation_every_n_samples = config.has_validation_every_n_samples()
                                           ? config.validation_every_n_samples()
                                       : options.megatron.paths.empty() ? kValidationEveryNSamples
                                                                        : 0;
  const int64_t every_n = options.validation_every_n_samples;
  return Require(every_n == 0 || every_n >= 2, "data.validation_every_n_samples", every_n,
                 "must be 0 (no validation) or >= 2");
}

// The first sizes in [1, limit] (at most 8, none past 2^20) for which `fits` holds, as
// "1, 2, 4" ("none" when there are none).
template <typename Fits>
std::string Working(int64_t limit, Fits fits) {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= std::min<int64_t>(limit, 1 << 20) && sizes.size() < 8; ++n) {
    if (fits(n)) sizes.push_back(n);
  }
  return sizes.empty() ? "none" : absl::StrJoin(sizes, ", ");
}

// The pipeline stages split the layers evenly, each holding at least one; the distributed
// optimizer's shards of the tied embedding would differ between the first and last stage.
absl::Status CheckPipelineParallelModel(const TrainOptions& options) {
  const int64_t pp = options.distributed.parallel.pipeline_model_parallel_size;
  const int64_t layers = options.model.num_layers;
  KEEL_RETURN_IF_ERROR(
      Require(pp > 0, "distributed.pipeline_model_parallel_size", pp, "must be > 0"));
  if (layers % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.pipeline_model_parallel_size (", pp, ") must divide model.num_layers (",
        layers, "): each stage holds an equal number of layers, at least one; sizes that do: ",
        Working(layers, [layers](int64_t n) { return layers % n == 0; })));
  }
  if (pp > 1 && options.distributed.use_distributed_optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.use_distributed_optimizer with pipeline_model_parallel_size ", pp,
        ": not supported yet (the tied embedding's shards differ between the first and last "
        "stage); allowed: use_distributed_optimizer false, or pipeline_model_parallel_size 1"));
  }
  return absl::OkStatus();
}

// Mixture of experts: experts split evenly over ep, k of them per token (each expert split over
// tp as the MLPs are, which CheckModelParallelModel checks).
absl::Status CheckMixtureOfExperts(const TrainOptions& options) {
  const models::ModelOptions& m = options.model;
  const parallel::ModelParallelOptions& p = options.distributed.parallel;
  const int64_t ep = p.expert_model_parallel_size;
  KEEL_RETURN_IF_ERROR(
      Require(ep > 0, "distributed.expert_model_parallel_size", ep, "must be > 0"));
  if (m.num_moe_experts == 0) {
    return Require(ep == 1, "distributed.expert_model_parallel_size", ep,
                   "needs model.num_moe_experts > 0 (experts to split); allowed: 1");
  }
  KEEL_RETURN_IF_ERROR(
      Require(m.moe_layer_freq > 0, "model.moe_layer_freq", m.moe_layer_freq, "must be > 0"));
  KEEL_RETURN_IF_ERROR(Require(m.moe_aux_loss_coeff >= 0 && std::isfinite(m.moe_aux_loss_coeff),
                               "model.moe_aux_loss_coeff", m.moe_aux_loss_coeff,
                               "must be a finite number >= 0"));
  if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_moe_experts) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe_router_topk (", m.moe_router_topk,
                                                   ") must be in [1, model.num_moe_experts (",
                                                   m.num_moe_experts, ")]"));
  }
  if (m.num_moe_experts % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.expert_model_parallel_size (", ep, ") must divide model.num_moe_experts (",
        m.num_moe_experts, "): each expert-parallel rank holds an equal share; sizes that do: ",
        Working(m.num_moe_experts, [&](int64_t n) { return m.num_moe_experts % n == 0; })));
  }
  return absl::OkStatus();
}

// The tensor-parallel size splits the attention heads and the MLP evenly (the vocabulary is
// padded to fit); the pipeline size the layers.
absl::Status CheckModelParallelModel(const TrainOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckPipelineParallelModel(options));
  KEEL_RETURN_IF_ERROR(CheckMixtureOfExperts(options));
  const int64_t tp = options.distributed.parallel.tensor_model_parallel_size;
  const models::ModelOptions& m = options.model;
  KEEL_RETURN_IF_ERROR(
      Require(tp > 0, "distributed.tensor_model_parallel_size", tp, "must be > 0"));
  std::vector<std::pair<const char*, int64_t>> split = {
      {"model.num_attention_heads", m.num_attention_heads},
      {"model.ffn_hidden_size", m.ffn_hidden_size}};
  // Llama-style: each rank holds its key-value heads with the query heads that read them.
  if (m.family != models::ModelFamily::kGpt) {
    split.emplace_back("model.num_query_groups", models::KvHeads(m));
  }
  for (const auto& [field, value] : split) {
    if (value % tp == 0) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.tensor_model_parallel_size (", tp, ") must divide ", field, " (",
                     value, "): each tensor-parallel rank holds an equal share; sizes that do: ",
                     Working(value, [value](int64_t n) { return value % n == 0; })));
  }
  return absl::OkStatus();
}

}  // namespace

bool AbslParseFlag(absl::string_view text, NonFinitePolicy* out, std::string* error) {
  return base::ParseEnum(kNonFinitePolicies, text, out, error);
}

std::string AbslUnparseFlag(NonFinitePolicy policy) {
  return std::string(base::EnumName(kNonFinitePolicies, policy));
}

namespace {

// peft.adapter_path: the adapter's r, lora_alpha, lora_dropout (peft's on A's input) and
// target modules into options.peft, where the section sets none of them otherwise.
absl::Status ReadAdapterPath(const PeftConfig& section, TrainOptions& options) {
  options.peft_adapter_path = section.adapter_path();
  absl::StatusOr<peft::PeftLoraConfig> config = peft::ReadPeftConfig(options.peft_adapter_path);
  KEEL_RETURN_IF_ERROR(base::Annotate(config.status(), "peft.adapter_path"));
  const peft::LoraOptions adapter = peft::LoraOptionsFromPeft(*config);
  peft::LoraOptions& lora = *options.peft;
  const std::string source = absl::StrCat(
      "peft.adapter_path's ", base::JoinPath(options.peft_adapter_path, peft::kPeftConfigName));
  auto contradiction = [&](absl::string_view field, const std::string& set,
                           const std::string& theirs) {
    return absl::InvalidArgumentError(absl::StrCat("peft.", field, " (", set, ") contradicts ",
                                                   source, " (", theirs,
                                                   "); allowed: unset, or the adapter's value"));
  };
  if (section.has_dim() && lora.dim != adapter.dim) {
    return contradiction("dim", absl::StrCat(lora.dim), absl::StrCat("r ", adapter.dim));
  }
  if (section.has_alpha() && lora.alpha != adapter.alpha) {
    return contradiction("alpha", absl::StrCat(lora.alpha),
                         absl::StrCat("lora_alpha ", adapter.alpha));
  }
  if (section.has_dropout() && lora.dropout != adapter.dropout) {
    return contradiction("dropout", absl::StrCat(lora.dropout),
                         absl::StrCat("lora_dropout ", adapter.dropout));
  }
  if (section.has_dropout_position() && lora.dropout_position != adapter.dropout_position) {
    return contradiction("dropout_position", peft::AbslUnparseFlag(lora.dropout_position),
                         "peft's dropout acts on A's input: \"pre\"");
  }
  if (!lora.target_modules.empty() || !lora.exclude_modules.empty() || lora.match_all_linear) {
    return contradiction(
        lora.match_all_linear
            ? "match_all_linear"
            : (lora.target_modules.empty() ? "exclude_modules" : "target_modules"),
        "set", absl::StrCat("target_modules: ", config->target_modules.size(), " layers"));
  }
  lora.dim = adapter.dim;
  lora.alpha = adapter.alpha;
  lora.dropout = adapter.dropout;
  lora.dropout_position = adapter.dropout_position;
  lora.target_modules = adapter.target_modules;
  return absl::OkStatus();
}

// packed_sequence: a size of 0 or more, packing only conversations.
absl::Status ReadPackedSequence(const PackedSequenceConfig& config, TrainOptions& options) {
  KEEL_RETURN_IF_ERROR(CopyFields(config, options.packed_sequence));
  const int64_t size = options.packed_sequence.packed_sequence_size;
  KEEL_RETURN_IF_ERROR(Require(size >= 0, "packed_sequence.packed_sequence_size", size,
                               "must be >= 0 (0: no packing)"));
  if (size > 0 && options.data.sft.format != DataFormat::kSft) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed_sequence.packed_sequence_size (", size,
                     ") packs conversations; allowed with data.format \"sft\", else 0"));
  }
  return absl::OkStatus();
}

// Sequence parallelism splits each row's sequence over the tensor-parallel ranks between their
// layers, whose mixture-of-experts blocks take the whole sequence.
absl::Status CheckSequenceParallel(const TrainOptions& options) {
  if (!options.distributed.sequence_parallel) return absl::OkStatus();
  const int64_t tp = options.distributed.parallel.tensor_model_parallel_size;
  if (tp == 1) {
    return absl::InvalidArgumentError(
        "distributed.sequence_parallel (true) splits the sequence over the tensor-parallel ranks, "
        "and distributed.tensor_model_parallel_size is 1; allowed: sequence_parallel false, or "
        "tensor_model_parallel_size > 1");
  }
  if (options.model.num_moe_experts > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.sequence_parallel (true) with model.num_moe_experts (",
        options.model.num_moe_experts,
        "): Keel's mixture-of-experts blocks take the whole sequence; allowed: sequence_parallel "
        "false, or num_moe_experts 0"));
  }
  const int64_t packed = options.packed_sequence.packed_sequence_size;
  const auto [field, length] =
      packed > 0 ? std::pair{"packed_sequence.packed_sequence_size", packed}
                 : std::pair{"data.sequence_length", options.data.dataset.sequence_length};
  if (length % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " (", length, ") must be divisible by distributed.tensor_model_parallel_size (", tp,
      ") with distributed.sequence_parallel: each tensor-parallel rank holds an equal share of "
      "every sequence; allowed: a multiple of ",
      tp, ", or sequence_parallel false"));
}

}  // namespace

absl::StatusOr<TrainOptions> ReadOptions(const TrainConfig& config) {
  TrainOptions options;
  options.run_dir = config.run_dir();
  if (options.run_dir.empty()) return absl::InvalidArgumentError("run_dir must be set");
  options.seed = config.has_seed() ? config.seed() : 0;
  KEEL_RETURN_IF_ERROR(CheckCounts(config));
  KEEL_RETURN_IF_ERROR(CopyFields(config.step_scheduler(), options.step_scheduler));
  options.local_batch_size = config.step_scheduler().local_batch_size();
  KEEL_RETURN_IF_ERROR(Require(options.local_batch_size > 0, "step_scheduler.local_batch_size",
                               options.local_batch_size, "must be > 0"));
  KEEL_RETURN_IF_ERROR(ReadData(config.data(), options.data));
  if (!options.data.megatron.paths.empty()) KEEL_RETURN_IF_ERROR(CheckMegatronData(options));
  KEEL_RETURN_IF_ERROR(
      CopyFields(config.sampler(), options.sampler, {"micro_batch_size", "global_batch_size"}));
  options.sampler.micro_batch_size = options.local_batch_size;
  options.sampler.global_batch_size = options.step_scheduler.global_batch_size;
  KEEL_RETURN_IF_ERROR(ReadModel(config, options));
  KEEL_RETURN_IF_ERROR(ReadOptimizer(config.optimizer(), options.optimizer));
  KEEL_RETURN_IF_ERROR(ReadLrScheduler(config.lr_scheduler(), options.optimizer.lr,
                                       options.optimizer.weight_decay, options.lr_scheduler,
                                       options.derived_lr_steps));
  if (config.clip_grad().has_max_norm()) {
    options.max_norm = config.clip_grad().max_norm();
    // 0 would zero every gradient and a negative threshold turn them around.
    KEEL_RETURN_IF_ERROR(Require(options.max_norm > 0, "clip_grad.max_norm", options.max_norm,
                                 "must be > 0 (unset: no clipping)"));
  }
  options.check_norm_every_steps = config.clip_grad().check_norm_every_steps();
  KEEL_RETURN_IF_ERROR(Require(options.check_norm_every_steps >= 0,
                               "clip_grad.check_norm_every_steps", options.check_norm_every_steps,
                               "must be >= 0 (0: never)"));
  options.checkpoint.checkpoint_dir = base::JoinPath(options.run_dir, "checkpoints");
  KEEL_RETURN_IF_ERROR(CopyFields(config.checkpoint(), options.checkpoint));
  KEEL_RETURN_IF_ERROR(
      base::Annotate(checkpoint::CheckCheckpointerOptions(options.checkpoint), "checkpoint"));
  KEEL_RETURN_IF_ERROR(ReadDistributed(config.distributed(), options.distributed));
  options.tf32 = config.model().tf32();
  if (options.tf32 && options.distributed.backend != parallel::Backend::kNccl) {
    return absl::InvalidArgumentError(
        "model.tf32 (true) applies to GPU runs (distributed.backend \"nccl\"); allowed on the "
        "CPU: false");
  }
  options.bf16 = config.model().bf16();
  if (const std::optional<bool> in_fp32 = options.distributed.grad_reduce_in_fp32;
      in_fp32.has_value() && !options.bf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.grad_reduce_in_fp32 (", *in_fp32 ? "true" : "false",
        ") applies to model.bf16 runs (float32 runs reduce float32 gradients); allowed without "
        "model.bf16: unset"));
  }
  if (const std::optional<bool> fusion = options.distributed.gradient_accumulation_fusion;
      fusion.has_value() && !options.bf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.gradient_accumulation_fusion (", *fusion ? "true" : "false",
        ") applies to model.bf16 runs, whose main gradients it fills (float32 runs keep .grad); "
        "allowed without model.bf16: unset"));
  }
  KEEL_RETURN_IF_ERROR(CheckModelParallelModel(options));
  KEEL_RETURN_IF_ERROR(parallel::CheckRecomputeOptions(
      options.model.recompute,
      options.model.num_layers / options.distributed.parallel.pipeline_model_parallel_size));
  KEEL_RETURN_IF_ERROR(ReadLogging(config.logging(), options.logging));
  KEEL_RETURN_IF_ERROR(ReadNumerics(config.numerics(), options.numerics));
  KEEL_RETURN_IF_ERROR(ReadPackedSequence(config.packed_sequence(), options));
  KEEL_RETURN_IF_ERROR(CheckSequenceParallel(options));
  if (config.loss_fn().has_chunk_len()) {
    const int64_t chunk_len = config.loss_fn().chunk_len();
    KEEL_RETURN_IF_ERROR(Require(chunk_len >= 0, "loss_fn.chunk_len", chunk_len,
                                 "must be >= 0 (0: the logits whole)"));
    options.model.cross_entropy_chunk_len = chunk_len;
  }
  if (config.has_peft()) {
    peft::LoraOptions& lora = options.peft.emplace();
    KEEL_RETURN_IF_ERROR(CopyFields(config.peft(), lora, {"adapter_path"}));
    if (!config.peft().adapter_path().empty()) {
      KEEL_RETURN_IF_ERROR(ReadAdapterPath(config.peft(), options));
    }
    KEEL_RETURN_IF_ERROR(peft::CheckLoraOptions(lora));
    KEEL_RETURN_IF_ERROR(CheckAdapterCount(lora.dim, options.model));
    if (options.model.num_moe_experts > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "peft with model.num_moe_experts (", options.model.num_moe_experts,
          "): the experts' grouped weights take no LoRA adapters; allowed: no peft section, or "
          "model.num_moe_experts 0"));
    }
  }
  return options;
}

absl::StatusOr<parallel::MeshLayout> CheckGeometry(const TrainOptions& options, int world_size) {
  absl::StatusOr<parallel::MeshLayout> layout =
      parallel::MeshLayout::Create(options.distributed.parallel, world_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(layout.status(), "distributed"));
  const int dp = layout->data_parallel_size();
  const int64_t global = options.step_scheduler.global_batch_size;
  const int64_t local = options.local_batch_size;
  if (global > 0 && global % (local * dp) == 0) {
    const int64_t pp = options.distributed.parallel.pipeline_model_parallel_size;
    const int64_t micro_batches = global / (local * dp);
    if (micro_batches >= pp) return layout;
    return absl::InvalidArgumentError(absl::StrCat(
        "the 1F1B schedule of distributed.pipeline_model_parallel_size ", pp, " needs at least ",
        pp, " micro-batches per step, got step_scheduler.global_batch_size (", global,
        ") / (local_batch_size (", local, ") x data-parallel size (", dp, ")) = ", micro_batches,
        "; global_batch_size values that work: multiples of ", local * dp, " from ",
        local * dp * pp));
  }
  const std::string ranks = dp == world_size ? absl::StrCat("the world size (", world_size, ")")
                                             : absl::StrCat("the data-parallel size (", dp, " of ",
                                                            world_size, " ranks)");
  return absl::InvalidArgumentError(absl::StrCat(
      "step_scheduler.global_batch_size (", global,
      ") must be a positive multiple of step_scheduler.local_batch_size (", local, ") x ", ranks,
      " = ", local * dp, "; ", dp == world_size ? "world" : "data-parallel",
      " sizes that work with this local_batch_size: ",
      Working(global, [&](int64_t w) { return global % local == 0 && global / local % w == 0; }),
      "; local_batch_size values that work on ", dp, " data-parallel rank(s): ",
      Working(global, [&](int64_t l) { return global % dp == 0 && global / dp % l == 0; })));
}

}  // namespace keel::tools::recipe
