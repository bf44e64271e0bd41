#include "checkpoint/model_state.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/named_parameters.h"
#include "base/status.h"

namespace keel::checkpoint {
namespace {}  // namespace

std::vector<std::string> DropOuterPrefix(const std::vector<std::string>& keys,
                                         absl::string_view prefix) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    out.push_back(absl::StartsWith(key, prefix) ? key.substr(prefix.size()) : key);
  }
  return out;
}

std::vector<std::string> AddOuterPrefix(const std::vector<std::string>& keys,
                                        absl::string_view prefix,
                                        const std::vector<std::string>& skip_keys) {
  const std::set<std::string> skip(skip_keys.begin(), skip_keys.end());
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    out.push_back(absl::StartsWith(key, prefix) || skip.count(key) > 0 ? key
                                                                       : absl::StrCat(prefix, key));
  }
  return out;
}

ModelState::ModelState(torch::nn::Module& model, ModelStateOptions options)
    : model_(&model), options_(std::move(options)) {}

absl::StatusOr<std::vector<ModelState::Entry>> ModelState::Entries() const {
  const auto params = model_->named_parameters(/*recurse=*/true);
  const auto buffers = model_->named_buffers(/*recurse=*/true);

  for (const auto& [name, layout] : options_.layouts) {
    if (params.find(name) == nullptr && buffers.find(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("layouts: '", name, "' is not a parameter or buffer of the model"));
    }
  }
  for (const auto& [name, stand_in] : options_.stand_ins) {
    if (params.find(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("stand_ins: '", name, "' is not a parameter of the model"));
    }
  }

  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, param] : base::UniqueNamedParameters(*model_).unique) {
    if (options_.is_peft && !param.requires_grad()) continue;
    names.push_back(name);
    tensors.push_back(param);
  }
  if (!options_.is_peft) {
    for (const auto& item : buffers) {
      names.push_back(item.key());
      tensors.push_back(item.value());
    }
  }

  const std::vector<std::string> keys = Keys(names);

  std::map<std::string, size_t> first_with_key;
  std::vector<Entry> entries;
  entries.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto [it, inserted] = first_with_key.emplace(keys[i], i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", names[it->second], "' and '", names[i], "' both have the key '", keys[i], "' (",
          options_.is_peft ? "is_peft adds " : "safetensors drops ", "the outer prefix '",
          options_.is_peft ? kPeftPrefix : kHfModelPrefix, "')"));
    }
    Entry entry;
    entry.key = keys[i];
    entry.tensor = tensors[i];
    if (auto p = options_.layouts.find(names[i]); p != options_.layouts.end()) {
      entry.layout = p->second;
    }
    if (auto s = options_.stand_ins.find(names[i]); s != options_.stand_ins.end()) {
      entry.tensor = s->second.tensor;
      entry.layout = s->second.layout;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<std::string> ModelState::Keys(const std::vector<std::string>& names) const {
  if (options_.is_peft) return AddOuterPrefix(names, kPeftPrefix);
  if (options_.model_save_format == SerializationFormat::kSafetensors) {
    return DropOuterPrefix(names, kHfModelPrefix);
  }
  return names;
}

std::map<std::string, std::string> ModelState::TiedKeys() const {
  std::map<std::string, std::string> tied;
  for (const auto& [repeat, first] : base::UniqueNamedParameters(*model_).repeats) {
    tied.emplace(Keys({repeat})[0], Keys({first})[0]);
  }
  return tied;
}

absl::StatusOr<State> ModelState::StateDict() const {
  KEEL_ASSIGN_OR_RETURN(std::vector<Entry> entries, Entries());
  State state;
  for (Entry& entry : entries) {
    state.tensors[entry.key] = TensorRef{entry.tensor.detach(), std::move(entry.layout)};
  }
  return state;
}

absl::Status ModelState::LoadStateDict(StateReader& reader) {
  KEEL_ASSIGN_OR_RETURN(std::vector<Entry> entries, Entries());
  for (Entry& entry : entries) {
    KEEL_RETURN_IF_ERROR(
        reader.ReadTensor(entry.key, TensorRef{entry.tensor, std::move(entry.layout)}));
  }
  return absl::OkStatus();
}

}  // namespace keel::checkpoint
