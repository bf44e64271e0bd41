#include "tools/recipe/one_rank_model.h"

#include <map>
#include <memory>
#include <string>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_state.h"
#include "checkpoint/reader.h"
#include "models/hf_config.h"
#include "models/hf_directory.h"
#include "models/registry.h"
#include "peft/lora_adapter.h"
#include "peft/module_matcher.h"
#include "peft/peft_format.h"
#include "tools/recipe/lora.h"
#include "tools/recipe/options.h"
#include "torch/utils.h"

namespace keel::tools::recipe {
namespace {

// The model of `options` on one rank, its allocation failing as an error.
absl::StatusOr<std::shared_ptr<models::LanguageModel>> Build(const models::ModelOptions& options,
                                                             const std::string& source) {
  std::shared_ptr<models::LanguageModel> model;
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kResourceExhausted, absl::StrCat("building the model of ", source),
      [&] { model = models::BuildLanguageModel(options, models::ModelGroups{}); }));
  return model;
}

absl::StatusOr<OneRankModel> FromHuggingFace(const std::string& directory) {
  OneRankModel loaded;
  KEEL_ASSIGN_OR_RETURN(loaded.options, models::ReadHfDirectory(directory));
  KEEL_RETURN_IF_ERROR(base::Annotate(
      CheckModelValues(loaded.options),
      absl::StrCat(models::HfConfigPath(directory), ", read as Keel's model fields")));
  KEEL_ASSIGN_OR_RETURN(loaded.model, Build(loaded.options, directory));
  KEEL_RETURN_IF_ERROR(checkpoint::LoadHfSafetensors(directory, *loaded.model, {}, {},
                                                     models::HfVocabRows(loaded.options))
                           .status());
  loaded.source = absl::StrCat("Hugging Face directory ", directory);
  loaded.hf_directory = directory;
  return loaded;
}

absl::StatusOr<OneRankModel> FromCheckpoint(const std::string& step_dir) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::CheckpointReader> reader,
                        checkpoint::CheckpointReader::Open(step_dir));
  absl::StatusOr<base::Json> config = reader->ReadValues(kConfigState);
  if (absl::IsNotFound(config.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(step_dir, " holds no saved configuration (\"", kConfigState,
                     "\"): it was not written by tools:train, so its model is unknown"));
  }
  KEEL_RETURN_IF_ERROR(config.status());
  KEEL_ASSIGN_OR_RETURN(const SavedModel saved, ReadSavedModel(*config));
  OneRankModel loaded;
  loaded.options = saved.options;
  // One rank pads the vocabulary as the saved tensor-parallel run did: rounding it up to a
  // multiple of its padded size gives exactly that size.
  if (saved.padded_vocab_size > 0) {
    loaded.options.make_vocab_size_divisible_by = saved.padded_vocab_size;
  }
  KEEL_RETURN_IF_ERROR(
      base::Annotate(CheckModelValues(loaded.options), absl::StrCat(step_dir, "'s configuration")));
  if (saved.peft.has_value()) {
    // A LoRA run's checkpoint holds the adapters: the frozen base is built as the run built it.
    torch::manual_seed(saved.seed);
  }
  KEEL_ASSIGN_OR_RETURN(loaded.model, Build(loaded.options, step_dir));
  checkpoint::ModelStateOptions keys;
  keys.model_save_format = saved.model_save_format;
  if (saved.peft.has_value()) {
    if (!saved.pretrained_path.empty()) {
      KEEL_RETURN_IF_ERROR(
          base::Annotate(checkpoint::LoadHfSafetensors(saved.pretrained_path, *loaded.model, keys,
                                                       {}, models::HfVocabRows(loaded.options))
                             .status(),
                         absl::StrCat("the frozen base of LoRA checkpoint ", step_dir,
                                      " (its model.pretrained_path)")));
    }
    KEEL_RETURN_IF_ERROR(AttachAdapters(*loaded.model, loaded.options, *saved.peft, saved.seed));
    keys.is_peft = true;
  }
  KEEL_ASSIGN_OR_RETURN(const checkpoint::State state,
                        checkpoint::ModelState(*loaded.model, keys).StateDict());
  for (const auto& [key, ref] : state.tensors) {
    const std::string name = absl::StrCat(kModelState, "/", key);
    KEEL_ASSIGN_OR_RETURN(const at::Tensor saved_tensor, reader->ReadTensor(name));
    if (!saved_tensor.sizes().equals(ref.tensor.sizes())) {
      return absl::FailedPreconditionError(absl::StrCat(
          step_dir, ": ", name, " has shape ", c10::str(saved_tensor.sizes()),
          "; the model its configuration describes has ", c10::str(ref.tensor.sizes())));
    }
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "copying " + name, [&] {
      at::NoGradGuard no_grad;
      ref.tensor.copy_(saved_tensor);
    }));
  }
  loaded.source = absl::StrCat("checkpoint ", step_dir);
  return loaded;
}

}  // namespace

absl::StatusOr<OneRankModel> LoadOneRankModel(const std::string& path) {
  if (base::PathExists(models::HfConfigPath(path))) return FromHuggingFace(path);
  if (base::PathExists(checkpoint::ManifestPath(path))) return FromCheckpoint(path);
  if (!base::PathExists(path)) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  KEEL_ASSIGN_OR_RETURN(const checkpoint::FindResult found, checkpoint::FindLatest(path));
  if (!found.latest) {
    return absl::NotFoundError(absl::StrCat(
        path,
        " is neither a Hugging Face directory (config.json), a checkpoint (a manifest) nor a "
        "run's checkpoint_dir with a checkpoint that verifies",
        found.warnings.empty() ? ""
                               : absl::StrCat(" (", absl::StrJoin(found.warnings, "; "), ")")));
  }
  return FromCheckpoint(found.latest->path);
}

absl::Status AddPeftAdapter(const std::string& directory, OneRankModel& loaded) {
  KEEL_ASSIGN_OR_RETURN(const peft::PeftLoraConfig config, peft::ReadPeftConfig(directory));
  const peft::LoraOptions lora = peft::LoraOptionsFromPeft(config);
  KEEL_ASSIGN_OR_RETURN(const std::vector<peft::LinearModule> modules,
                        peft::SelectLinearModules(*loaded.model, lora));
  KEEL_RETURN_IF_ERROR(peft::AttachLoraAdapters(*loaded.model, modules, lora));
  KEEL_RETURN_IF_ERROR(peft::LoadPeftAdapter(directory, *loaded.model, lora).status());
  absl::StrAppend(&loaded.source, " with the peft LoRA adapter ", directory, " (r ", config.r,
                  ", lora_alpha ", config.lora_alpha, ", ", modules.size(), " layers)");
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
