// A trained model whole on one rank, for tools that run it rather than train it (tools:eval):
// from a Hugging Face directory (config.json and its safetensors: models/hf_config.h,
// checkpoint/hf_import.h) or from a checkpoint of tools:train, whose saved configuration
// (kConfigState) gives the model and its padded vocabulary.
//
//   KEEL_ASSIGN_OR_RETURN(OneRankModel loaded, LoadOneRankModel("runs/llama/checkpoints"));
//   at::Tensor losses = loaded.model->TokenLosses(tokens, labels);
#ifndef KEEL_TOOLS_RECIPE_ONE_RANK_MODEL_H_
#define KEEL_TOOLS_RECIPE_ONE_RANK_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "models/language_model.h"
#include "models/model_options.h"

namespace keel::tools::recipe {

struct OneRankModel {
  std::shared_ptr<models::LanguageModel> model;
  // What it was built from: the vocabulary padded as in training (a checkpoint's padding rows,
  // which the GPT trains, are kept).
  models::ModelOptions options;
  // Where its weights came from, for a log line ("Hugging Face directory D" or "checkpoint P").
  std::string source;
  // The Hugging Face directory it was read from (its tokenizer's too); empty for a checkpoint.
  std::string hf_directory;
};

// `path`: a directory holding config.json (Hugging Face), a checkpoint's step directory, or a
// run's checkpoint_dir (its newest checkpoint that verifies). The model is in float32 on the
// CPU, in training mode as built (a LoRA adapter's dropout acts until eval()). A LoRA run's
// checkpoint gives its base (model.pretrained_path's weights, or the seed's initialisation
// without one) with the checkpoint's adapters.
// Errors: kNotFound for a path that is none of these (or a checkpoint_dir without a
// checkpoint); kFailedPrecondition for a checkpoint not written by tools:train (no saved
// configuration); as models::ReadHfConfig, checkpoint::LoadHfSafetensors and
// checkpoint::CheckpointReader (a tensor missing, mis-shaped or corrupt is named).
[[nodiscard]] absl::StatusOr<OneRankModel> LoadOneRankModel(const std::string& path);

// Adds Hugging Face peft's LoRA adapter in `directory` (adapter_config.json and
// adapter_model.safetensors, peft/peft_format.h) to `loaded`'s model: adapters on the layers it
// names, with its weights. Errors: as peft::ReadPeftConfig, peft::SelectLinearModules (a target
// the model lacks), peft::AttachLoraAdapters (a model with adapters already) and
// peft::LoadPeftAdapter.
[[nodiscard]] absl::Status AddPeftAdapter(const std::string& directory, OneRankModel& loaded);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_ONE_RANK_MODEL_H_
