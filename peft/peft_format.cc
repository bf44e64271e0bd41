#include "peft/peft_format.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/quote.h"
#include "base/status.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_state.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "parallel/tensor_parallel/layers.h"

namespace keel::peft {
namespace {

using base::Json;
using base::Quote;
using base::ShapeString;

constexpr absl::string_view kAdapterSuffix[] = {".adapter.lora_A", ".adapter.lora_B"};
constexpr absl::string_view kPeftSuffix[] = {".lora_A.weight", ".lora_B.weight"};

// The adapted module of `name` and which of A (0) and B (1) it is, for a name ending in one of
// `suffixes` after a non-empty module name; nullopt for another name.
std::optional<std::pair<std::string, int>> Split(absl::string_view name,
                                                 const absl::string_view (&suffixes)[2]) {
  for (int which = 0; which < 2; ++which) {
    if (name.size() > suffixes[which].size() && absl::EndsWith(name, suffixes[which])) {
      return std::pair{std::string(name.substr(0, name.size() - suffixes[which].size())), which};
    }
  }
  return std::nullopt;
}

// adapter_config.json's fields that change what an adapter computes, with the values Keel
// computes alike: peft's defaults (an absent field has its default).
const std::vector<std::pair<std::string, std::vector<Json>>>& RepresentableValues() {
  static const auto* const values = new std::vector<std::pair<std::string, std::vector<Json>>>{
      {"peft_type", {"LORA"}},
      {"task_type", {"CAUSAL_LM", nullptr}},
      {"bias", {"none"}},
      {"use_rslora", {false}},
      {"use_dora", {false}},
      {"fan_in_fan_out", {false}},
      {"lora_bias", {false}},
      {"modules_to_save", {nullptr, Json::array()}},
      {"exclude_modules", {nullptr, Json::array()}},
      {"rank_pattern", {nullptr, Json::object()}},
      {"alpha_pattern", {nullptr, Json::object()}},
      {"layers_to_transform", {nullptr}},
      {"layers_pattern", {nullptr}},
      {"target_parameters", {nullptr, Json::array()}},
      {"trainable_token_indices", {nullptr}},
      {"layer_replication", {nullptr}},
  };
  return *values;
}

// One module's adapter.
struct ModuleAdapter {
  at::Tensor lora_A;  // [r, in]
  at::Tensor lora_B;  // [out, r]
};

// `adapter` (by peft key) by module, checked: both weights of each module, of one rank r.
absl::StatusOr<std::map<std::string, ModuleAdapter>> ByModule(
    const std::map<std::string, at::Tensor>& adapter) {
  std::map<std::string, ModuleAdapter> modules;
  for (const auto& [key, tensor] : adapter) {
    KEEL_ASSIGN_OR_RETURN(const std::string parameter, AdapterParameter(key));
    const auto [module, which] = *Split(parameter, kAdapterSuffix);
    (which == 0 ? modules[module].lora_A : modules[module].lora_B) = tensor;
  }
  if (modules.empty()) return absl::InvalidArgumentError("no LoRA adapter tensors");
  std::optional<int64_t> r;
  for (const auto& [module, weights] : modules) {
    if (!weights.lora_A.defined() || !weights.lora_B.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("module ", Quote(module), " has lora_", weights.lora_A.defined() ? "A" : "B",
                       " without lora_", weights.lora_A.defined() ? "B" : "A"));
    }
    const std::vector<int64_t> a = weights.lora_A.sizes().vec();
    const std::vector<int64_t> b = weights.lora_B.sizes().vec();
    if (!r.has_value() && a.size() == 2) r = a[0];
    if (a.size() != 2 || b.size() != 2 || a[0] != *r || b[1] != *r) {
      return absl::InvalidArgumentError(absl::StrCat(
          "module ", Quote(module), ": lora_A ", ShapeString(a), " and lora_B ", ShapeString(b),
          " are not [r, in] and [out, r] of the adapters' r (", r.value_or(0), ")"));
    }
  }
  return modules;
}

// A number of adapter_config.json at `key` in `path` that `valid` accepts (`allowed` says
// which); `out` keeps its value when the key is absent and `required` is false.
absl::Status ReadNumber(const Json& config, const std::string& path, const std::string& key,
                        bool required, const std::function<bool(double)>& valid,
                        absl::string_view allowed, double& out) {
  const auto it = config.find(key);
  if (it == config.end() && !required) return absl::OkStatus();
  if (it == config.end() || !it->is_number() || !valid(it->get<double>())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", key, " is ", it == config.end() ? "missing" : base::Excerpt(*it),
                     "; allowed: ", allowed));
  }
  out = it->get<double>();
  return absl::OkStatus();
}

// `name` as a regular expression matching itself alone: every character but letters, digits
// and '_' escaped.
std::string Escaped(absl::string_view name) {
  std::string escaped;
  for (const char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

// When `directory` holds adapter_model.safetensors, that its header's LoRA tensors are of rank
// `r`, as `config_path` says: A [r, in] and B [out, r]. Only the header is read, so that a
// disagreement is named before adapters of rank r are allocated for the tensors.
absl::Status CheckRankOfWeights(const std::string& directory, const std::string& config_path,
                                int64_t r) {
  const std::string weights_path = base::JoinPath(directory, kPeftWeightsName);
  if (!base::PathExists(weights_path)) return absl::OkStatus();
  KEEL_ASSIGN_OR_RETURN(const checkpoint::SafetensorsHeader header,
                        checkpoint::ReadSafetensorsHeader(weights_path));
  for (const checkpoint::SafetensorsEntry& entry : header.entries) {
    const auto split = Split(entry.name, kPeftSuffix);
    if (!split.has_value()) continue;
    const int which = split->second;  // A [r, in] or B [out, r]: r is dimension `which`
    if (entry.shape.size() == 2 && entry.shape[which] == r) continue;
    return absl::FailedPreconditionError(
        absl::StrCat(weights_path, " holds ", Quote(entry.name), " of shape ",
                     ShapeString(entry.shape), ", where the r ", r, " of ", config_path, " needs ",
                     which == 0 ? absl::StrCat("[", r, ", in]") : absl::StrCat("[out, ", r, "]"),
                     ": the config is not the adapter's"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> PeftKey(absl::string_view parameter) {
  const auto split = Split(parameter, kAdapterSuffix);
  if (!split.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(parameter), " is no LoRA adapter parameter (<module>.adapter.lora_A or ",
                     "<module>.adapter.lora_B)"));
  }
  return absl::StrCat(checkpoint::kPeftPrefix, split->first, kPeftSuffix[split->second]);
}

absl::StatusOr<std::string> AdapterParameter(absl::string_view peft_key) {
  const auto split = absl::StartsWith(peft_key, checkpoint::kPeftPrefix)
                         ? Split(peft_key.substr(checkpoint::kPeftPrefix.size()), kPeftSuffix)
                         : std::nullopt;
  if (!split.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quote(peft_key), " is no peft LoRA key (", checkpoint::kPeftPrefix,
        "<module>.lora_A.weight or ", checkpoint::kPeftPrefix, "<module>.lora_B.weight)"));
  }
  return absl::StrCat(split->first, kAdapterSuffix[split->second]);
}

Json PeftConfigToJson(const PeftLoraConfig& config) {
  Json json = Json::object();
  // peft's LoraConfig types lora_alpha as an int: an integral value is written as one.
  const bool integral =
      std::floor(config.lora_alpha) == config.lora_alpha && std::fabs(config.lora_alpha) < 9.0e15;
  for (const auto& [key, value] : std::vector<std::pair<std::string, Json>>{
           {"base_model_name_or_path", config.base_model_name_or_path},
           {"bias", "none"},
           {"fan_in_fan_out", false},
           {"inference_mode", true},
           {"init_lora_weights", true},
           {"lora_alpha",
            integral ? Json(static_cast<int64_t>(config.lora_alpha)) : Json(config.lora_alpha)},
           {"lora_dropout", config.lora_dropout},
           {"modules_to_save", nullptr},
           {"peft_type", "LORA"},
           {"r", config.r},
           {"target_modules", config.target_modules},
           {"task_type", "CAUSAL_LM"},
           {"use_dora", false},
           {"use_rslora", false},
       }) {
    json[key] = value;
  }
  return json;
}

absl::StatusOr<PeftLoraConfig> ReadPeftConfig(const std::string& directory) {
  const std::string path = base::JoinPath(directory, kPeftConfigName);
  KEEL_ASSIGN_OR_RETURN(const Json config, base::ReadJsonFile(path));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is no JSON object"));
  }
  for (const auto& [key, allowed] : RepresentableValues()) {
    const auto it = config.find(key);
    if (it == config.end() || std::find(allowed.begin(), allowed.end(), *it) != allowed.end()) {
      continue;
    }
    std::vector<std::string> spelled;
    for (const Json& value : allowed) spelled.push_back(value.dump());
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", key, " is ", base::Excerpt(*it), "; Keel's LoRA adapters compute only ",
        absl::StrJoin(spelled, " or "), " (absent: peft's default)"));
  }
  PeftLoraConfig read;
  double r = 0;
  KEEL_RETURN_IF_ERROR(ReadNumber(
      config, path, "r", /*required=*/true,
      [](double v) { return v >= 1 && std::floor(v) == v && v < 9.0e15; }, "an integer >= 1", r));
  read.r = static_cast<int64_t>(r);
  KEEL_RETURN_IF_ERROR(ReadNumber(
      config, path, "lora_alpha", /*required=*/true, [](double v) { return v > 0; }, "> 0",
      read.lora_alpha));
  KEEL_RETURN_IF_ERROR(ReadNumber(
      config, path, "lora_dropout", /*required=*/false, [](double v) { return v >= 0 && v < 1; },
      "in [0, 1)", read.lora_dropout));
  const auto targets = config.find("target_modules");
  const bool names = targets != config.end() && targets->is_array() && !targets->empty() &&
                     std::all_of(targets->begin(), targets->end(), [](const Json& name) {
                       return name.is_string() && !name.get<std::string>().empty();
                     });
  if (!names) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": target_modules is ", targets == config.end() ? "missing" : base::Excerpt(*targets),
        "; allowed: a non-empty list of module names (Keel reads no regular expression)"));
  }
  for (const Json& name : *targets) read.target_modules.push_back(name.get<std::string>());
  std::sort(read.target_modules.begin(), read.target_modules.end());
  const auto base_model = config.find("base_model_name_or_path");
  if (base_model != config.end() && base_model->is_string()) {
    read.base_model_name_or_path = base_model->get<std::string>();
  }
  KEEL_RETURN_IF_ERROR(CheckRankOfWeights(directory, path, read.r));
  return read;
}

LoraOptions LoraOptionsFromPeft(const PeftLoraConfig& config) {
  LoraOptions options;
  for (const std::string& name : config.target_modules) {
    options.target_modules.push_back(absl::StrCat("(*\\.)?", Escaped(name)));
  }
  options.dim = config.r;
  options.alpha = config.lora_alpha;
  options.dropout = config.lora_dropout;
  options.dropout_position = DropoutPosition::kPre;
  return options;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointAdapter(
    const std::string& checkpoint_path, const std::string& object) {
  KEEL_ASSIGN_OR_RETURN(const std::unique_ptr<checkpoint::CheckpointReader> reader,
                        checkpoint::CheckpointReader::Open(checkpoint_path));
  const std::string prefix = absl::StrCat(object, "/");
  std::map<std::string, at::Tensor> adapter;
  for (const checkpoint::TensorEntry& entry : reader->manifest().tensors()) {
    if (!absl::StartsWith(entry.name(), prefix)) continue;
    const absl::string_view key = absl::string_view(entry.name()).substr(prefix.size());
    const absl::StatusOr<std::string> peft_key =
        absl::StartsWith(key, checkpoint::kPeftPrefix)
            ? PeftKey(key.substr(checkpoint::kPeftPrefix.size()))
            : absl::InvalidArgumentError("no peft prefix");
    if (!peft_key.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          checkpoint_path, ": \"", object, "\" holds ", Quote(key), ", which is no LoRA adapter ",
          "parameter (", checkpoint::kPeftPrefix, "<module>.adapter.lora_A or .lora_B): not the ",
          "checkpoint of a LoRA run"));
    }
    KEEL_ASSIGN_OR_RETURN(adapter[*peft_key], reader->ReadTensor(entry.name()));
  }
  if (adapter.empty()) {
    return absl::NotFoundError(
        absl::StrCat(checkpoint_path, ": object \"", object, "\" holds no tensors"));
  }
  return adapter;
}

absl::StatusOr<PeftLoraConfig> WritePeftAdapter(const std::map<std::string, at::Tensor>& adapter,
                                                const std::string& output_dir,
                                                const PeftWriteOptions& options) {
  if (options.dtype.has_value() && !at::isFloatingType(*options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype (", c10::toString(*options.dtype), ") must be a floating-point dtype"));
  }
  KEEL_ASSIGN_OR_RETURN(const auto modules, ByModule(adapter));
  PeftLoraConfig config;
  config.r = modules.begin()->second.lora_A.size(0);
  config.lora_alpha = options.lora_alpha;
  config.lora_dropout = options.lora_dropout;
  config.base_model_name_or_path = options.base_model_name_or_path;
  for (const auto& [module, weights] : modules) config.target_modules.push_back(module);

  KEEL_RETURN_IF_ERROR(base::MakeDirectories(output_dir));
  const std::string weights_path = base::JoinPath(output_dir, kPeftWeightsName);
  const std::string config_path = base::JoinPath(output_dir, kPeftConfigName);
  for (const std::string& path : {weights_path, config_path}) {
    if (base::PathExists(path)) {
      return absl::AlreadyExistsError(absl::StrCat(output_dir, " already holds an adapter (", path,
                                                   "); remove it or choose another"));
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [key, tensor] : adapter) {
    tensors.emplace_back(key, options.dtype.has_value() ? tensor.to(*options.dtype) : tensor);
  }
  KEEL_RETURN_IF_ERROR(checkpoint::WriteSafetensorsFile(weights_path, tensors, {{"format", "pt"}}));
  // peft's spelling: json.dumps(indent=2, sort_keys=True).
  KEEL_RETURN_IF_ERROR(base::WriteFileAtomically(
      config_path,
      absl::StrCat(nlohmann::json::parse(PeftConfigToJson(config).dump()).dump(2), "\n")));
  return config;
}

absl::StatusOr<checkpoint::HfImportResult> LoadPeftAdapter(
    const std::string& directory, torch::nn::Module& model, const LoraOptions& options,
    const std::set<std::string>& held_elsewhere) {
  KEEL_ASSIGN_OR_RETURN(const PeftLoraConfig config, ReadPeftConfig(directory));
  if (options.dim != config.r || options.alpha != config.lora_alpha) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's adapters (peft.dim ", options.dim, ", peft.alpha ", options.alpha,
                     ") are not those of ", base::JoinPath(directory, kPeftConfigName), " (r ",
                     config.r, ", lora_alpha ", config.lora_alpha, ")"));
  }
  checkpoint::ModelStateOptions state;
  state.is_peft = true;
  state.layouts = parallel::ParameterLayouts(model);
  checkpoint::HfFileNames names;
  names.stem = "adapter_model";
  names.name_in_files = [](const std::string& key) {
    // A trainable parameter that is no adapter keeps its key, and is reported missing.
    if (!absl::StartsWith(key, checkpoint::kPeftPrefix)) return key;
    const absl::StatusOr<std::string> peft_key =
        PeftKey(absl::string_view(key).substr(checkpoint::kPeftPrefix.size()));
    return peft_key.ok() ? *peft_key : key;
  };
  std::set<std::string> elsewhere_in_files;
  for (const std::string& key : held_elsewhere) elsewhere_in_files.insert(names.name_in_files(key));
  return checkpoint::LoadHfSafetensors(directory, model, state, elsewhere_in_files, {}, names);
}

absl::Status MergePeftAdapter(const std::map<std::string, at::Tensor>& adapter, double lora_alpha,
                              std::map<std::string, at::Tensor>& weights) {
  KEEL_ASSIGN_OR_RETURN(const auto modules, ByModule(adapter));
  std::map<std::string, at::Tensor> merged;
  for (const auto& [module, lora] : modules) {
    const std::string name = absl::StrCat(module, ".weight");
    const auto it = weights.find(name);
    const int64_t r = lora.lora_A.size(0);
    const std::vector<int64_t> shape = {lora.lora_B.size(0), lora.lora_A.size(1)};
    if (it == weights.end() || it->second.sizes().vec() != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("the adapter of ", Quote(module), " needs a weight ", Quote(name),
                       " of shape ", ShapeString(shape), "; the model's is ",
                       it == weights.end() ? "missing" : ShapeString(it->second.sizes().vec())));
    }
    const at::Tensor delta = at::matmul(lora.lora_B.to(at::kFloat), lora.lora_A.to(at::kFloat)) *
                             (lora_alpha / static_cast<double>(r));
    merged[name] = it->second + delta.to(it->second.scalar_type());
  }
  for (auto& [name, tensor] : merged) weights[name] = std::move(tensor);
  return absl::OkStatus();
}

}  // namespace keel::peft
