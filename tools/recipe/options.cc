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
#include "base/quote.h"
#include "base/status.h"
#include "base/utf8.h"
#include "checkpoint/checkpoint.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "peft/peft_format.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/numpy_random.h"
#include "tools/recipe/config.h"
#include "tools/recipe/internal/option_checks.h"

namespace keel::tools::recipe {

std::string TooLarge() {
  return absl::StrCat("is beyond ", kMaxCount,
                      ", the largest size or count a configuration takes (Keel's products of a "
                      "few of them stay exact in 64 bits)");
}

namespace {

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

// Every text in `fingerprint` (a path, a module pattern) is UTF-8: checkpoints record the
// fingerprint as protobuf text, which must be, so other bytes would fail the first save.
absl::Status CheckRecordedText(const base::Json& fingerprint, const std::string& where) {
  if (fingerprint.is_string()) {
    const std::string& text = fingerprint.get_ref<const std::string&>();
    if (const std::optional<size_t> bad = base::FirstInvalidUtf8(text)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " ", base::Quote(text), " is not UTF-8 (byte ", *bad,
                       " starts no character); checkpoints record it, as UTF-8 text only"));
    }
    return absl::OkStatus();
  }
  if (!fingerprint.is_structured()) return absl::OkStatus();
  for (const auto& [key, value] : fingerprint.items()) {
    KEEL_RETURN_IF_ERROR(CheckRecordedText(
        value, fingerprint.is_array() ? absl::StrCat(where, "[", key, "]")
                                      : (where.empty() ? key : absl::StrCat(where, ".", key))));
  }
  return absl::OkStatus();
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

// Settings that the rest of the configuration leaves unread: `fields` of `section` apply only
// when `applies`, whose absence `missing` names.
struct Applicability {
  absl::string_view section_name;
  const google::protobuf::Message& section;
  std::vector<absl::string_view> fields;
  bool applies;
  absl::string_view missing;
};

// Each setting applies to the run, or is refused rather than silently ignored (a WSD length
// with a cosine decay, an expert count's companions without experts).
absl::Status CheckSettingsApply(const TrainConfig& config, const TrainOptions& options) {
  using google::protobuf::FieldDescriptor;
  const models::ModelOptions& m = options.model;
  const std::optional<parallel::RecomputeGranularity> granularity =
      m.recompute.recompute_granularity;
  const Applicability rules[] = {
      {"data",
       config.data(),
       {"split", "seed", "index_mapping_dir"},
       !options.data.megatron.paths.empty(),
       "Megatron's GPT datasets, and data.paths is empty"},
      {"data",
       config.data(),
       {"overlong"},
       options.data.sft.format == DataFormat::kSft,
       "conversations, and data.format is not \"sft\""},
      {"sampler",
       config.sampler(),
       {"pad_samples_to_global_batch_size"},
       options.sampler.dataloader_type == sampling::DataloaderType::kSingle &&
           !options.sampler.drop_last,
       "the last batch of the sequential sampler, and sampler.dataloader_type is not "
       "\"single\" with drop_last false"},
      {"model",
       config.model(),
       {"moe_router_topk", "moe_aux_loss_coeff", "moe_layer_freq", "moe_router_pre_softmax"},
       m.num_moe_experts > 0,
       "mixture-of-experts models, and model.num_moe_experts is 0"},
      {"model",
       config.model(),
       {"recompute_method", "recompute_num_layers"},
       granularity.has_value(),
       "recomputation, and model.recompute_granularity is unset"},
      {"model",
       config.model(),
       {"recompute_modules"},
       granularity == parallel::RecomputeGranularity::kSelective,
       "selective recomputation, and model.recompute_granularity is not \"selective\""},
      {"lr_scheduler",
       config.lr_scheduler(),
       {"wsd_decay_steps", "lr_wsd_decay_style"},
       options.lr_scheduler.lr_decay_style == optim::LrDecayStyle::kWsd,
       "the WSD schedule, and lr_scheduler.lr_decay_style is not \"WSD\""},
      {"logging",
       config.logging(),
       {"profile_after_step"},
       options.logging.profile_steps > 0,
       "profiles, and logging.profile_steps is 0"},
      {"numerics",
       config.numerics(),
       {"max_consecutive_skipped_steps"},
       options.numerics.on_nonfinite == NonFinitePolicy::kSkip,
       "skipped steps, and numerics.on_nonfinite is not \"skip\""},
  };
  for (const Applicability& rule : rules) {
    if (rule.applies) continue;
    const google::protobuf::Reflection& reflection = *rule.section.GetReflection();
    for (const absl::string_view name : rule.fields) {
      const FieldDescriptor* field =
          rule.section.GetDescriptor()->FindFieldByName(std::string(name));
      const bool set = field->is_repeated() ? reflection.FieldSize(rule.section, field) > 0
                                            : reflection.HasField(rule.section, field);
      if (!set) continue;
      std::vector<std::string> values(
          field->is_repeated() ? reflection.FieldSize(rule.section, field) : 1);
      for (size_t i = 0; i < values.size(); ++i) {
        google::protobuf::TextFormat::PrintFieldValueToString(
            rule.section, field, field->is_repeated() ? static_cast<int>(i) : -1, &values[i]);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          rule.section_name, ".", name, " (", base::Printable(absl::StrJoin(values, ", ")),
          ") applies to ", rule.missing, "; allowed: unset"));
    }
  }
  return absl::OkStatus();
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
  }
  KEEL_RETURN_IF_ERROR(CheckSettingsApply(config, options));
  KEEL_RETURN_IF_ERROR(CheckRecordedText(ConfigFingerprint(options), ""));
  return options;
}

}  // namespace keel::tools::recipe
