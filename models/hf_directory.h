// A Hugging Face model directory read as a whole before anything is built from it:
// config.json's options (ReadHfConfig) checked against the tensors its safetensors files hold
// (their headers only), so that a config.json the weights contradict (another depth, other
// widths, sizes past any model) is refused by name before a model of its sizes is allocated.
//
//   KEEL_ASSIGN_OR_RETURN(ModelOptions options, ReadHfDirectory("/models/qwen3-0.6b"));
//   std::shared_ptr<LanguageModel> model = BuildLanguageModel(options, {});  // fits the files
#ifndef KEEL_MODELS_HF_DIRECTORY_H_
#define KEEL_MODELS_HF_DIRECTORY_H_

#include <string>

#include "absl/status/statusor.h"
#include "models/model_options.h"

namespace keel::models {

// ReadHfConfig(directory), then: the files hold layers 0 to num_layers - 1 ("model.layers.<i>."),
// and each tensor of a one-layer model of those options that the files hold has the files'
// shape (the vocabulary's rows unpadded). Errors: ReadHfConfig's;
// checkpoint::ReadHfTensors'; kInvalidArgument naming config.json's key and the files'
// contradiction, or sizes no tensor can have.
[[nodiscard]] absl::StatusOr<ModelOptions> ReadHfDirectory(const std::string& directory);

}  // namespace keel::models

#endif  // KEEL_MODELS_HF_DIRECTORY_H_
