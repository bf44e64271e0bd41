#include "checkpoint/optimizer_state.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "base/json.h"
#include "base/named_parameters.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "checkpoint/internal/optimizer_traits.h"
#include "parallel/layout.h"

namespace keel::checkpoint {
namespace {

using internal::WithTraits;
using ::keel::base::Json;
using Names = std::vector<std::vector<std::string>>;
using Layouts = std::map<std::string, parallel::TensorLayout>;

// Reads the JSON object `json` into `o`. Each absent field that is not optional is reported
// missing as "<what>.<field>"; returns whether none was.
template <typename O>
absl::StatusOr<bool> ReadAllFields(const Json& json, const std::string& what, StateReader& reader,
                                   O& o) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a JSON object, got ", json.dump()));
  }
  bool complete = true;
  VisitFields(o, [&](absl::string_view name, auto& field) {
    if constexpr (!base::IsOptional<std::decay_t<decltype(field)>>::value) {
      if (!json.contains(std::string(name))) {
        reader.ReportMissing(absl::StrCat(what, ".", name));
        complete = false;
      }
    }
  });
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(json, o, absl::StrCat(what, ".")));
  return complete;
}

std::optional<parallel::TensorLayout> LayoutOf(const Layouts& layouts, const std::string& name) {
  auto it = layouts.find(name);
  if (it == layouts.end()) return std::nullopt;
  return it->second;
}

// The options of param group `i`, checked to be K's.
template <typename K>
absl::StatusOr<typename K::Options*> GroupOptions(torch::optim::OptimizerParamGroup& group,
                                                  size_t i) {
  auto* options = dynamic_cast<typename K::Options*>(&group.options());
  if (options == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("param_groups[", i,
                                                   "] has options of another type than ",
                                                   optim::OptimizerKindName(K::kKind)));
  }
  return options;
}

template <typename K>
absl::StatusOr<State> SaveOptimizer(torch::optim::Optimizer& optimizer, const Names& names,
                                    const Layouts& layouts) {
  State state;
  Json groups = Json::array();
  Json states = Json::object();
  for (size_t i = 0; i < optimizer.param_groups().size(); ++i) {
    torch::optim::OptimizerParamGroup& group = optimizer.param_groups()[i];
    KEEL_ASSIGN_OR_RETURN(typename K::Options * options, GroupOptions<K>(group, i));
    Json saved_group = Json::object();
    saved_group["params"] = names[i];
    const Json group_options = base::WriteJsonFields(K::ToGroup(*options));
    for (const auto& field : group_options.items()) {
      saved_group[field.key()] = field.value();
    }
    groups.push_back(std::move(saved_group));
    for (size_t j = 0; j < group.params().size(); ++j) {
      const std::string& name = names[i][j];
      if (states.contains(name)) continue;
      auto it = optimizer.state().find(base::OptimizerStateKeyOf(group.params()[j]));
      if (it == optimizer.state().end()) continue;
      const auto* param_state = dynamic_cast<const typename K::ParamState*>(it->second.get());
      if (param_state == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("the state of parameter '", name,
                                                       "' is not ",
                                                       optim::OptimizerKindName(K::kKind), "'s"));
      }
      Json entry = Json::object();
      K::Save(*param_state, absl::StrCat("state/", name, "/"), LayoutOf(layouts, name), state,
              entry);
      states[name] = std::move(entry);
    }
  }
  state.values["type"] = std::string(optim::OptimizerKindName(K::kKind));
  state.values["param_groups"] = std::move(groups);
  state.values["state"] = std::move(states);
  return state;
}

// A mismatch line for a param group whose parameters here are not all in the checkpoint's.
std::optional<std::string> ParamsMismatch(const std::string& what,
                                          const std::vector<std::string>& saved,
                                          const std::vector<std::string>& here) {
  const std::set<std::string> in_checkpoint(saved.begin(), saved.end());
  for (size_t j = 0; j < here.size(); ++j) {
    if (in_checkpoint.count(here[j]) == 0) {
      return absl::StrCat(what, ".params[", j, "]: '", here[j], "' is not in the checkpoint's (",
                          saved.size(), " parameters)");
    }
  }
  return std::nullopt;
}

// Every saving rank's values as one: each param group's parameters and the states of all of
// them (pipeline stages save their own; a stage, or one rank, loads its part of the union).
Json MergedValues(const std::vector<Json>& ranks) {
  if (ranks.empty()) return Json::object();
  Json merged = ranks.front();
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r] == merged) continue;
    const Json groups = ranks[r].value("param_groups", Json::array());
    for (size_t i = 0; i < groups.size() && i < merged["param_groups"].size(); ++i) {
      Json& params = merged["param_groups"][i]["params"];
      const Json names = groups[i].value("params", Json::array());
      for (const Json& name : names) {
        if (std::find(params.begin(), params.end(), name) == params.end()) params.push_back(name);
      }
    }
    const Json states = ranks[r].value("state", Json::object());
    for (const auto& item : states.items()) merged["state"][item.key()] = item.value();
  }
  return merged;
}

template <typename K>
absl::Status LoadOptimizer(const Json& values, StateReader& reader,
                           torch::optim::Optimizer& optimizer, const Names& names,
                           const Layouts& layouts) {
  std::vector<torch::optim::OptimizerParamGroup>& groups = optimizer.param_groups();
  std::vector<typename K::Options*> options(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    KEEL_ASSIGN_OR_RETURN(options[i], GroupOptions<K>(groups[i], i));
  }

  bool fits = true;
  for (const char* key : {"type", "param_groups", "state"}) {
    if (!values.contains(key)) {
      reader.ReportMissing(key);
      fits = false;
    }
  }
  if (!fits) return absl::OkStatus();
  std::string type;
  KEEL_RETURN_IF_ERROR(base::FromJson(values["type"], "type", type));
  if (type != optim::OptimizerKindName(K::kKind)) {
    reader.ReportMismatch(absl::StrCat("type: ", type, " in the checkpoint, ",
                                       optim::OptimizerKindName(K::kKind), " here"));
    return absl::OkStatus();
  }
  const Json& saved_groups = values["param_groups"];
  if (!saved_groups.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param_groups must be a JSON array, got ", saved_groups.dump()));
  }
  if (saved_groups.size() != groups.size()) {
    reader.ReportMismatch(absl::StrCat("param_groups: ", saved_groups.size(),
                                       " in the checkpoint, ", groups.size(), " here"));
    return absl::OkStatus();
  }
  std::vector<typename K::Group> saved_options(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string what = absl::StrCat("param_groups[", i, "]");
    KEEL_ASSIGN_OR_RETURN(bool complete,
                          ReadAllFields(saved_groups[i], what, reader, saved_options[i]));
    if (complete) {
      KEEL_RETURN_IF_ERROR(K::Check(saved_options[i], what));
    } else {
      fits = false;
    }
    if (!saved_groups[i].contains("params")) {
      reader.ReportMissing(absl::StrCat(what, ".params"));
      fits = false;
      continue;
    }
    std::vector<std::string> saved_names;
    KEEL_RETURN_IF_ERROR(
        base::FromJson(saved_groups[i]["params"], absl::StrCat(what, ".params"), saved_names));
    if (std::optional<std::string> mismatch = ParamsMismatch(what, saved_names, names[i])) {
      reader.ReportMismatch(*mismatch);
      fits = false;
    }
  }
  const Json& saved_states = values["state"];
  if (!saved_states.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state must be a JSON object, got ", saved_states.dump()));
  }
  if (!fits) return absl::OkStatus();

  std::vector<
      std::pair<base::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>>
      loaded;
  std::set<std::string> seen;
  for (size_t i = 0; i < groups.size(); ++i) {
    for (size_t j = 0; j < groups[i].params().size(); ++j) {
      const std::string& name = names[i][j];
      if (!seen.insert(name).second) continue;
      auto entry = saved_states.find(name);
      if (entry == saved_states.end()) continue;
      const at::Tensor& param = groups[i].params()[j];
      KEEL_ASSIGN_OR_RETURN(
          std::unique_ptr<typename K::ParamState> param_state,
          K::Load(param, saved_options[i], *entry, absl::StrCat("state/", name, "/"),
                  LayoutOf(layouts, name), reader));
      if (param_state != nullptr)
        loaded.emplace_back(base::OptimizerStateKeyOf(param), std::move(param_state));
    }
  }

  if (reader.checking()) return absl::OkStatus();
  for (size_t i = 0; i < groups.size(); ++i) {
    K::Apply(saved_options[i], *options[i]);
    for (const at::Tensor& param : groups[i].params())
      optimizer.state().erase(base::OptimizerStateKeyOf(param));
  }
  for (auto& [key, param_state] : loaded) optimizer.state()[key] = std::move(param_state);
  return absl::OkStatus();
}

}  // namespace

OptimizerState::OptimizerState(optim::OptimizerKind kind, torch::nn::Module* model,
                               NamedTensors named, torch::optim::Optimizer& optimizer,
                               optim::ParamScheduler* scheduler,
                               std::map<std::string, parallel::TensorLayout> layouts)
    : kind_(kind),
      model_(model),
      named_(std::move(named)),
      optimizer_(&optimizer),
      scheduler_(scheduler),
      layouts_(std::move(layouts)) {}

absl::StatusOr<OptimizerState> OptimizerState::Create(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer, optim::ParamScheduler* scheduler,
    std::map<std::string, parallel::TensorLayout> layouts) {
  const auto params = model.named_parameters(/*recurse=*/true);
  for (const auto& [name, layout] : layouts) {
    if (params.find(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("layouts: '", name, "' is not a parameter of the model"));
    }
  }
  return Make(&model, {}, optimizer, scheduler, std::move(layouts));
}

absl::StatusOr<OptimizerState> OptimizerState::Create(optim::DistributedOptimizer& optimizer,
                                                      optim::ParamScheduler* scheduler) {
  NamedTensors named;
  std::map<std::string, parallel::TensorLayout> layouts;
  for (const gradients::ParamShard& shard : optimizer.shards()) {
    named.emplace_back(shard.name, shard.tensor);
    layouts[shard.name] = shard.layout;
  }
  return Make(nullptr, std::move(named), optimizer.optimizer(), scheduler, std::move(layouts));
}

absl::StatusOr<OptimizerState> OptimizerState::Create(optim::DataParallelOptimizer& optimizer,
                                                      optim::ParamScheduler* scheduler) {
  if (optim::DistributedOptimizer* sharded = optimizer.sharded()) {
    return Create(*sharded, scheduler);
  }
  NamedTensors named;
  std::map<std::string, parallel::TensorLayout> layouts;
  for (const gradients::NamedParameter& p : optimizer.StepParameters()) {
    named.emplace_back(p.name, p.param);
    if (p.layout) layouts[p.name] = *p.layout;
  }
  return Make(nullptr, std::move(named), optimizer.optimizer(), scheduler, std::move(layouts));
}

absl::StatusOr<OptimizerState> OptimizerState::Make(
    torch::nn::Module* model, NamedTensors named, torch::optim::Optimizer& optimizer,
    optim::ParamScheduler* scheduler, std::map<std::string, parallel::TensorLayout> layouts) {
  KEEL_ASSIGN_OR_RETURN(const optim::OptimizerKind kind, optim::KindOf(optimizer));
  OptimizerState state(kind, model, std::move(named), optimizer, scheduler, std::move(layouts));
  KEEL_RETURN_IF_ERROR(state.GroupParamNames().status());
  return state;
}

absl::StatusOr<std::vector<std::vector<std::string>>> OptimizerState::GroupParamNames() const {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  if (model_ != nullptr) {
    for (const auto& [name, param] : base::UniqueNamedParameters(*model_).unique) {
      names.emplace(param.unsafeGetTensorImpl(), name);
    }
  }
  for (const auto& [name, tensor] : named_) names.emplace(tensor.unsafeGetTensorImpl(), name);
  const char* const what = model_ != nullptr ? "a parameter of the model" : "a shard";
  std::vector<std::vector<std::string>> out;
  const auto& groups = optimizer_->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<std::string>& group_names = out.emplace_back();
    for (size_t j = 0; j < groups[i].params().size(); ++j) {
      const at::Tensor& param = groups[i].params()[j];
      auto it = names.find(param.unsafeGetTensorImpl());
      if (it == names.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("param_groups[", i, "].params[", j, "] (shape [",
                         absl::StrJoin(param.sizes(), ", "), "]) is not ", what));
      }
      group_names.push_back(it->second);
    }
  }
  return out;
}

absl::StatusOr<State> OptimizerState::StateDict() const {
  KEEL_ASSIGN_OR_RETURN(Names names, GroupParamNames());
  absl::StatusOr<State> state = WithTraits(kind_, [&](auto traits) {
    return SaveOptimizer<decltype(traits)>(*optimizer_, names, layouts_);
  });
  if (state.ok() && scheduler_ != nullptr) {
    state->values["sched"] = base::WriteJsonFields(scheduler_->StateDict());
  }
  return state;
}

absl::Status OptimizerState::LoadStateDict(StateReader& reader) {
  KEEL_ASSIGN_OR_RETURN(Names names, GroupParamNames());
  const Json values = MergedValues(reader.ValuesOfEachRank());
  // An empty object: nothing was saved under this name, which the reader has reported.
  if (values.empty()) return absl::OkStatus();
  KEEL_RETURN_IF_ERROR(WithTraits(kind_, [&](auto traits) {
    return LoadOptimizer<decltype(traits)>(values, reader, *optimizer_, names, layouts_);
  }));
  if (scheduler_ == nullptr) return absl::OkStatus();
  if (!values.contains("sched")) {
    reader.ReportMissing("sched");
    return absl::OkStatus();
  }
  optim::ParamSchedulerState sched;
  KEEL_ASSIGN_OR_RETURN(bool complete, ReadAllFields(values["sched"], "sched", reader, sched));
  if (!complete || reader.checking()) return absl::OkStatus();
  absl::Status status = scheduler_->LoadStateDict(sched);
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("sched: ", status.message()));
  }
  return absl::OkStatus();
}

}  // namespace keel::checkpoint
