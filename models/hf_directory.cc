#include "models/hf_directory.h"

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/quote.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/safetensors.h"
#include "models/hf_config.h"
#include "models/llama.h"

namespace keel::models {
namespace {

constexpr char kLayerPrefix[] = "model.layers.";

// The layer indices of the files' tensor names ("model.layers.<i>.").
std::set<int64_t> LayersIn(const std::map<std::string, checkpoint::SafetensorsEntry>& tensors) {
  std::set<int64_t> layers;
  for (const auto& [name, entry] : tensors) {
    if (!absl::StartsWith(name, kLayerPrefix)) continue;
    const std::string rest = name.substr(sizeof(kLayerPrefix) - 1);
    int64_t index = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &index)) layers.insert(index);
  }
  return layers;
}

}  // namespace

absl::StatusOr<ModelOptions> ReadHfDirectory(const std::string& directory) {
  KEEL_ASSIGN_OR_RETURN(const ModelOptions options, ReadHfConfig(directory));
  KEEL_ASSIGN_OR_RETURN(const auto tensors, checkpoint::ReadHfTensors(directory));
  const std::string config = HfConfigPath(directory);
  const std::set<int64_t> layers = LayersIn(tensors);
  if (static_cast<int64_t>(layers.size()) != options.num_layers ||
      (!layers.empty() && *layers.rbegin() != options.num_layers - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config, ": \"num_hidden_layers\" is ", options.num_layers, ", but the safetensors files ",
        layers.empty() ? std::string("hold no layer (no \"model.layers.<i>.\" tensor)")
                       : absl::StrCat("hold ", layers.size(), " layers, numbered ", *layers.begin(),
                                      " to ", *layers.rbegin())));
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kInvalidArgument,
                      absl::StrCat("laying out a layer of the sizes ", config, " gives"),
                      [&] { shapes = LlamaLayerShapes(options); }));
  const std::map<std::string, int64_t> vocab_rows = HfVocabRows(options);
  std::vector<std::string> contradictions;
  for (auto [name, shape] : shapes) {
    const auto in_files = tensors.find(name);
    if (in_files == tensors.end()) continue;  // the load names what is missing
    if (const auto rows = vocab_rows.find(name); rows != vocab_rows.end()) shape[0] = rows->second;
    if (in_files->second.shape != shape) {
      contradictions.push_back(
          absl::StrCat(base::Quote(name), " is ", base::ShapeString(shape), " by config.json, ",
                       base::ShapeString(in_files->second.shape), " in the files"));
    }
  }
  if (!contradictions.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config,
                     "'s sizes contradict the weights' (hidden_size, intermediate_size, "
                     "num_attention_heads, num_key_value_heads, head_dim or vocab_size): ",
                     absl::StrJoin(contradictions, "; ")));
  }
  return options;
}

}  // namespace keel::models
