// The run's configuration in its checkpoints (options.h): its fingerprint, the model a saved one
// describes, and what a resume changes.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {
namespace {

// The fields a resume cannot change: the model's shapes and vocabulary, how its fused qkv
// weight is laid out (checkpoints before tensor parallelism have none), and its LoRA adapters.
constexpr const char* kModelShapeFields[] = {
    "model.vocab_size",
    "model.padded_vocab_size",
    "model.hidden_size",
    "model.num_layers",
    "model.num_attention_heads",
    "model.ffn_hidden_size",
    "model.max_sequence_length",
    "model.qkv_rows",
    "data.sequence_length",
    "model.num_moe_experts",
    "model.moe_layer_freq",
    "peft",
    "peft.dim",
    "peft.target_modules",
    "peft.exclude_modules",
    "peft.match_all_linear",
};

// Adds "<prefix><key>" lines for every leaf where `saved` and `current` differ.
void Diff(const base::Json& saved, const base::Json& current, const std::string& prefix,
          std::vector<std::pair<std::string, std::string>>& lines) {
  if (saved.is_object() && current.is_object()) {
    for (const auto& [key, value] : saved.items()) {
      Diff(value, current.contains(key) ? current[key] : base::Json(), prefix + key + ".", lines);
    }
    for (const auto& [key, value] : current.items()) {
      if (!saved.contains(key)) Diff(base::Json(), value, prefix + key + ".", lines);
    }
    return;
  }
  if (saved == current) return;
  auto text = [](const base::Json& json) { return json.is_null() ? "absent" : json.dump(); };
  const std::string field = prefix.substr(0, prefix.size() - 1);
  lines.emplace_back(
      field, absl::StrCat(field, ": ", text(saved), " in the checkpoint, ", text(current), " now"));
}

}  // namespace

base::Json ConfigFingerprint(const TrainOptions& options) {
  base::Json model = base::WriteJsonFields(options.model);
  model["max_sequence_length"] = options.model.max_sequence_length;
  model["padded_vocab_size"] = models::PaddedVocabSize(
      options.model, options.distributed.parallel.tensor_model_parallel_size);
  model["qkv_rows"] = "q, k, v of each head in turn";
  model["pretrained_path"] = options.pretrained_path;
  if (options.model.recompute.recompute_granularity.has_value()) {
    model["recompute"] = base::WriteJsonFields(options.model.recompute);
  }
  if (const int64_t chunk_len = models::CrossEntropyChunkLen(options.model); chunk_len > 0) {
    model["cross_entropy_chunk_len"] = chunk_len;
  }
  base::Json data = base::WriteJsonFields(options.data.dataset);
  data["prefix"] = options.data.prefix;
  data["validation_every_n_samples"] = options.data.validation_every_n_samples;
  if (options.data.sft.format == DataFormat::kSft) {  // pretraining's fingerprint unchanged
    data.update(base::WriteJsonFields(options.data.sft));
    if (options.packed_sequence.packed_sequence_size > 0) {
      data.update(base::WriteJsonFields(options.packed_sequence));
    }
  }
  if (!options.data.megatron.paths.empty()) {
    data.update(base::WriteJsonFields(options.data.megatron));
  }
  base::Json checkpoint = base::WriteJsonFields(options.checkpoint);
  checkpoint.erase("checkpoint_dir");
  base::Json distributed = base::WriteJsonFields(options.distributed);
  // Off: as before Keel had it, so that older checkpoints' configurations compare equal.
  if (!options.distributed.sequence_parallel) distributed.erase("sequence_parallel");
  return {{"seed", options.seed},
          {"local_batch_size", options.local_batch_size},
          {"max_norm", base::ToJson(options.max_norm)},
          {"tf32", options.tf32},
          {kBf16Field, options.bf16},
          {"check_norm_every_steps", options.check_norm_every_steps},
          {"step_scheduler", base::WriteJsonFields(options.step_scheduler)},
          {"data", std::move(data)},
          {"sampler", base::WriteJsonFields(options.sampler)},
          {"model", std::move(model)},
          {"optimizer", base::WriteJsonFields(options.optimizer)},
          {"lr_scheduler", base::WriteJsonFields(options.lr_scheduler)},
          {"checkpoint", std::move(checkpoint)},
          {"distributed", std::move(distributed)},
          {"logging", base::WriteJsonFields(options.logging)},
          {"numerics", base::WriteJsonFields(options.numerics)},
          {"peft", options.peft ? base::WriteJsonFields(*options.peft) : base::Json()}};
}

absl::StatusOr<SavedModel> ReadSavedModel(const base::Json& fingerprint) {
  const auto model = fingerprint.find("model");
  if (model == fingerprint.end() || !model->is_object()) {
    return absl::InvalidArgumentError(
        "the checkpoint's configuration has no \"model\" section; it was not saved by "
        "tools:train");
  }
  SavedModel saved;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(*model, saved.options, "model."));
  KEEL_RETURN_IF_ERROR(base::FromJson(
      model->value("max_sequence_length", base::Json(saved.options.max_sequence_length)),
      "model.max_sequence_length", saved.options.max_sequence_length));
  KEEL_RETURN_IF_ERROR(base::FromJson(model->value("pretrained_path", base::Json("")),
                                      "model.pretrained_path", saved.pretrained_path));
  KEEL_RETURN_IF_ERROR(base::FromJson(model->value("padded_vocab_size", base::Json(0)),
                                      "model.padded_vocab_size", saved.padded_vocab_size));
  if (const auto peft = fingerprint.find("peft"); peft != fingerprint.end() && peft->is_object()) {
    KEEL_RETURN_IF_ERROR(base::ReadJsonFields(*peft, saved.peft.emplace(), "peft."));
  }
  KEEL_RETURN_IF_ERROR(
      base::FromJson(fingerprint.value("seed", base::Json(0)), "seed", saved.seed));
  const auto checkpoint = fingerprint.find("checkpoint");
  if (checkpoint != fingerprint.end() && checkpoint->contains("model_save_format")) {
    KEEL_RETURN_IF_ERROR(base::FromJson(checkpoint->at("model_save_format"),
                                        "checkpoint.model_save_format", saved.model_save_format));
  }
  return saved;
}

absl::StatusOr<checkpoint::State> ConfigState::StateDict() const {
  checkpoint::State state;
  state.values = fingerprint_;
  return state;
}

absl::Status ConfigState::LoadStateDict(checkpoint::StateReader&) { return absl::OkStatus(); }

ConfigChanges CompareConfigs(const base::Json& saved, const base::Json& current) {
  std::vector<std::pair<std::string, std::string>> lines;
  Diff(saved, current, "", lines);
  ConfigChanges changes;
  for (const auto& [field, line] : lines) {
    changes.changed.push_back(line);
    for (const char* shape : kModelShapeFields) {
      if (field == shape) changes.incompatible.push_back(line);
    }
  }
  return changes;
}

}  // namespace keel::tools::recipe
