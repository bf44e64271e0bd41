// Hugging Face peft's LoRA adapter directory (peft src/peft/utils/save_and_load.py and
// tuners/lora/config.py): "adapter_model.safetensors" with, per adapted linear layer <module>,
// "base_model.model.<module>.lora_A.weight" [r, in] and ".lora_B.weight" [out, r], and
// "adapter_config.json" (LoraConfig.to_dict()). Keel's adapters (peft/lora_adapter.h) compute
// what peft's do: base(x) + B(A(x)) * lora_alpha / r, peft's dropout on A's input (Keel's "pre").
// Out of a Keel LoRA checkpoint, into a model with adapters, and merged into a base, as peft's
// merge_and_unload(). Knows layers and files, no model family: module names are the model's own.
//
//   KEEL_ASSIGN_OR_RETURN(PeftLoraConfig config, ReadPeftConfig("/hf/llama-lora"));
//   const LoraOptions options = LoraOptionsFromPeft(config);
//   KEEL_ASSIGN_OR_RETURN(auto modules, SelectLinearModules(*model, options));
//   KEEL_RETURN_IF_ERROR(AttachLoraAdapters(*model, modules, options));
//   KEEL_RETURN_IF_ERROR(LoadPeftAdapter("/hf/llama-lora", *model, options).status());
#ifndef KEEL_PEFT_PEFT_FORMAT_H_
#define KEEL_PEFT_PEFT_FORMAT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "checkpoint/hf_import.h"
#include "peft/lora_options.h"
#include "torch/nn/module.h"

namespace keel::peft {

// peft's file names (utils/constants.py CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME).
inline constexpr char kPeftConfigName[] = "adapter_config.json";
inline constexpr char kPeftWeightsName[] = "adapter_model.safetensors";

// peft's key of Keel's adapter parameter "<module>.adapter.lora_A" (or lora_B):
// "base_model.model.<module>.lora_A.weight". Errors: kInvalidArgument for another name.
[[nodiscard]] absl::StatusOr<std::string> PeftKey(absl::string_view parameter);
// The adapter parameter of a peft key, the way back. Errors: kInvalidArgument for a key that is
// no LoRA A or B weight under "base_model.model.".
[[nodiscard]] absl::StatusOr<std::string> AdapterParameter(absl::string_view peft_key);

// The fields of peft's LoraConfig that decide what an adapter computes, with peft's names;
// adapter_config.json's other fields are written with peft's defaults and refused when reading
// finds another value that would change the computation.
struct PeftLoraConfig {
  // The rank. Default: 0 (none: peft's LoraConfig has 8, but a file always says).
  int64_t r = 0;
  // The adapter's output is scaled by lora_alpha / r. Default: 0 (none).
  double lora_alpha = 0;
  // Dropout on A's input, in training. Default: 0.
  double lora_dropout = 0;
  // The full names of the adapted modules, sorted (peft also matches a listed name as a suffix
  // after a '.'). Default: empty.
  std::vector<std::string> target_modules;
  // The model the adapter was trained on. Default: empty.
  std::string base_model_name_or_path;
};

// adapter_config.json of `config`: its fields, and peft_type "LORA", task_type "CAUSAL_LM",
// bias "none", use_rslora, use_dora and fan_in_fan_out false, modules_to_save null,
// init_lora_weights true, inference_mode true (what PeftModel.from_pretrained needs).
base::Json PeftConfigToJson(const PeftLoraConfig& config);

// `directory`/adapter_config.json. Errors: kNotFound for a missing file; kInvalidArgument naming
// the file, the key, its value and what Keel reads for what Keel cannot represent: a peft_type
// other than "LORA", a task_type other than "CAUSAL_LM", r < 1, lora_alpha <= 0, lora_dropout
// outside [0, 1), target_modules that are no non-empty list of names (peft's regular-expression
// string included), bias other than "none", use_rslora, use_dora, fan_in_fan_out or lora_bias
// true, modules_to_save, exclude_modules, rank_pattern, alpha_pattern, layers_to_transform,
// layers_pattern, target_parameters, trainable_token_indices or layer_replication set; as
// base::ReadJsonFile for a file that is not JSON. When adapter_model.safetensors lies beside it,
// its header is read too: kFailedPrecondition naming a LoRA tensor that is not [r, in] (A) or
// [out, r] (B) of the config's r, and as ReadSafetensorsHeader.
[[nodiscard]] absl::StatusOr<PeftLoraConfig> ReadPeftConfig(const std::string& directory);

// LoRA's options that build the adapters `config` describes: dim r, alpha lora_alpha, dropout
// lora_dropout on A's input (kPre), and target_modules that select what peft selects (each
// listed name, or a module whose name ends with "." and it), as patterns of
// SelectLinearModules: "(*\.)?" and the name with its '.' escaped.
LoraOptions LoraOptionsFromPeft(const PeftLoraConfig& config);

// The adapter of a Keel LoRA checkpoint (ModelState with is_peft: the trainable parameters
// under "base_model.model.") in its object `object`, whole, by peft key. Errors: kNotFound when
// the object holds no tensors; kFailedPrecondition naming a tensor that is no adapter
// parameter; as CheckpointReader::Open and ReadTensor.
[[nodiscard]] absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointAdapter(
    const std::string& checkpoint_path, const std::string& object = "model");

// What WritePeftAdapter writes beside the tensors.
struct PeftWriteOptions {
  // Written as lora_alpha (the run's peft.alpha). Default: 32 (LoraOptions').
  double lora_alpha = LoraOptions().alpha;
  // Written as lora_dropout (the run's peft.dropout; peft applies it to A's input). Default: 0.
  double lora_dropout = 0;
  // Written as base_model_name_or_path. Default: empty.
  std::string base_model_name_or_path;
  // The dtype of the tensors written; unset: as given. Default: unset.
  std::optional<at::ScalarType> dtype;
};

// Writes `adapter` (by peft key) as a peft adapter directory into `output_dir` (created if
// needed): adapter_model.safetensors (metadata {"format": "pt"}), then adapter_config.json, r
// and target_modules from the tensors. Returns the config written. Errors: kInvalidArgument for
// a key that is no LoRA weight, a module with A or B alone, tensors that are not [r, in] and
// [out, r] of one r, none at all, or a dtype that is not floating-point; kAlreadyExists when
// `output_dir` holds either file; as WriteSafetensorsFile.
[[nodiscard]] absl::StatusOr<PeftLoraConfig> WritePeftAdapter(
    const std::map<std::string, at::Tensor>& adapter, const std::string& output_dir,
    const PeftWriteOptions& options);

// Copies the adapter of the peft directory into the adapters of `model`, each rank its block
// (the model's parameter layouts), in place: LoadHfSafetensors with ModelState's is_peft keys
// (the trainable parameters: after AttachLoraAdapters, the adapters) under peft's names, strict
// both ways. Errors: as ReadPeftConfig; kInvalidArgument when options.dim or options.alpha
// (those the adapters were built with) differ from r and lora_alpha; as LoadHfSafetensors
// (kNotFound without adapter_model.safetensors; kFailedPrecondition naming missing, unexpected
// and mis-shaped tensors). `held_elsewhere`: the adapters of the other parts of a model split
// over ranks (pipeline stages), by their ModelState keys with is_peft, which the file may hold
// and this call leaves alone. Requires: `options` are the adapters'.
[[nodiscard]] absl::StatusOr<checkpoint::HfImportResult> LoadPeftAdapter(
    const std::string& directory, torch::nn::Module& model, const LoraOptions& options,
    const std::set<std::string>& held_elsewhere = {});

// peft's merge_and_unload() on tensors: for each adapted <module> of `adapter` (by peft key),
// weights["<module>.weight"] += (B @ A) * lora_alpha / r, the product in float32 and added in
// the weight's dtype. Errors: kInvalidArgument as WritePeftAdapter's for `adapter`, or naming a
// module whose weight `weights` lacks or whose shape is not [out, in]; `weights` is then
// unchanged.
[[nodiscard]] absl::Status MergePeftAdapter(const std::map<std::string, at::Tensor>& adapter,
                                            double lora_alpha,
                                            std::map<std::string, at::Tensor>& weights);

}  // namespace keel::peft

#endif  // KEEL_PEFT_PEFT_FORMAT_H_
