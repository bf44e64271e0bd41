#include "checkpoint/optimizer_state.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "ATen/ops/zeros_like.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "base/json.h"
#include "base/status.h"
#include "c10/util/C++17.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/sgd.h"

namespace keel::checkpoint {
namespace {

using ::keel::base::Json;
using Names = std::vector<std::vector<std::string>>;
using Placements = std::map<std::string, ShardPlacement>;

// Param-group options of Adam and AdamW, by their PyTorch names.
struct AdamGroupOptions {
  double lr = 0.0;
  std::vector<double> betas;
  double eps = 0.0;
  double weight_decay = 0.0;
  bool amsgrad = false;
};

template <typename O, typename V, base::IsFieldsOf<O, AdamGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("betas", o.betas);
  v("eps", o.eps);
  v("weight_decay", o.weight_decay);
  v("amsgrad", o.amsgrad);
}

// Param-group options of SGD, by their PyTorch names.
struct SgdGroupOptions {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

template <typename O, typename V, base::IsFieldsOf<O, SgdGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("momentum", o.momentum);
  v("dampening", o.dampening);
  v("weight_decay", o.weight_decay);
  v("nesterov", o.nesterov);
}

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

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
    if constexpr (!IsOptional<std::decay_t<decltype(field)>>::value) {
      if (!json.contains(std::string(name))) {
        reader.ReportMissing(absl::StrCat(what, ".", name));
        complete = false;
      }
    }
  });
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(json, o, absl::StrCat(what, ".")));
  return complete;
}

// The key of a parameter's state in Optimizer::state(), as LibTorch's optimizers compute it.
std::string StateKey(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

std::optional<ShardPlacement> PlacementOf(const Placements& placements, const std::string& name) {
  auto it = placements.find(name);
  if (it == placements.end()) return std::nullopt;
  return it->second;
}

// A new state tensor for `param` to read into; while checking, the parameter itself stands
// for it (same shape and dtype, never written).
at::Tensor StateLike(const at::Tensor& param, const StateReader& reader) {
  return reader.checking() ? param : at::zeros_like(param, at::MemoryFormat::Preserve);
}

// Reads the saved tensor `key` into `target`; clears `fits` unless the saved tensor exists
// with the target's dtype and global shape (the reader reports those differences).
absl::Status ReadInto(StateReader& reader, const std::string& key, const at::Tensor& target,
                      const std::optional<ShardPlacement>& placement, bool& fits) {
  const SavedTensorInfo* info = reader.FindTensor(key);
  const std::vector<int64_t> global = placement ? placement->global_shape : target.sizes().vec();
  if (info == nullptr || info->dtype != target.scalar_type() || info->shape != global) {
    fits = false;
  }
  return reader.ReadTensor(key, TensorRef{target, placement});
}

// Adam and AdamW, whose options and per-parameter state have the same fields.
template <typename OptionsT, typename ParamStateT>
struct AdamTraits {
  using Options = OptionsT;
  using ParamState = ParamStateT;
  using Group = AdamGroupOptions;

  static Group ToGroup(const Options& o) {
    return Group{o.lr(),
                 {std::get<0>(o.betas()), std::get<1>(o.betas())},
                 o.eps(),
                 o.weight_decay(),
                 o.amsgrad()};
  }

  static absl::Status Check(const Group& g, const std::string& what) {
    if (g.betas.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".betas must hold 2 values, got ", g.betas.size()));
    }
    return absl::OkStatus();
  }

  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.betas(std::make_tuple(g.betas[0], g.betas[1]));
    o.eps(g.eps);
    o.weight_decay(g.weight_decay);
    o.amsgrad(g.amsgrad);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<ShardPlacement>& placement, State& state, Json& entry) {
    entry["step"] = s.step();
    state.tensors[prefix + "exp_avg"] = TensorRef{s.exp_avg(), placement};
    state.tensors[prefix + "exp_avg_sq"] = TensorRef{s.exp_avg_sq(), placement};
    if (s.max_exp_avg_sq().defined()) {
      state.tensors[prefix + "max_exp_avg_sq"] = TensorRef{s.max_exp_avg_sq(), placement};
    }
  }

  // The saved state of `param`, or nullptr if part of it is missing or does not fit.
  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<ShardPlacement>& placement, StateReader& reader) {
    if (!entry.is_object() || !entry.contains("step")) {
      reader.ReportMissing(prefix + "step");
      return nullptr;
    }
    int64_t step = 0;
    KEEL_RETURN_IF_ERROR(base::FromJson(entry["step"], prefix + "step", step));
    if (step < 0) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "step (", step, ") must be >= 0"));
    }
    auto s = std::make_unique<ParamState>();
    s->step(step);
    bool fits = true;
    s->exp_avg(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "exp_avg", s->exp_avg(), placement, fits));
    s->exp_avg_sq(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "exp_avg_sq", s->exp_avg_sq(), placement, fits));
    if (group.amsgrad || reader.FindTensor(prefix + "max_exp_avg_sq") != nullptr) {
      s->max_exp_avg_sq(StateLike(param, reader));
      KEEL_RETURN_IF_ERROR(
          ReadInto(reader, prefix + "max_exp_avg_sq", s->max_exp_avg_sq(), placement, fits));
    }
    if (!fits) return nullptr;
    return s;
  }
};

struct AdamKind : AdamTraits<torch::optim::AdamOptions, torch::optim::AdamParamState> {
  static constexpr const char* kName = "Adam";
};
struct AdamWKind : AdamTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState> {
  static constexpr const char* kName = "AdamW";
};

struct SgdKind {
  using Options = torch::optim::SGDOptions;
  using ParamState = torch::optim::SGDParamState;
  using Group = SgdGroupOptions;
  static constexpr const char* kName = "SGD";

  static Group ToGroup(const Options& o) {
    return Group{o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()};
  }

  static absl::Status Check(const Group& g, const std::string& what) { return absl::OkStatus(); }

  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.momentum(g.momentum);
    o.dampening(g.dampening);
    o.weight_decay(g.weight_decay);
    o.nesterov(g.nesterov);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<ShardPlacement>& placement, State& state, Json& entry) {
    if (s.momentum_buffer().defined()) {
      state.tensors[prefix + "momentum_buffer"] = TensorRef{s.momentum_buffer(), placement};
    }
  }

  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<ShardPlacement>& placement, StateReader& reader) {
    auto s = std::make_unique<ParamState>();
    bool fits = true;
    s->momentum_buffer(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(
        ReadInto(reader, prefix + "momentum_buffer", s->momentum_buffer(), placement, fits));
    if (!fits) return nullptr;
    return s;
  }
};

// The options of param group `i`, checked to be K's.
template <typename K>
absl::StatusOr<typename K::Options*> GroupOptions(torch::optim::OptimizerParamGroup& group,
                                                  size_t i) {
  auto* options = dynamic_cast<typename K::Options*>(&group.options());
  if (options == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("param_groups[", i, "] has options of another type than ", K::kName));
  }
  return options;
}

template <typename K>
absl::StatusOr<State> SaveOptimizer(torch::optim::Optimizer& optimizer, const Names& names,
                                    const Placements& placements) {
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
      auto it = optimizer.state().find(StateKey(group.params()[j]));
      if (it == optimizer.state().end()) continue;
      const auto* param_state = dynamic_cast<const typename K::ParamState*>(it->second.get());
      if (param_state == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("the state of parameter '", name, "' is not ", K::kName, "'s"));
      }
      Json entry = Json::object();
      K::Save(*param_state, absl::StrCat("state/", name, "/"), PlacementOf(placements, name), state,
              entry);
      states[name] = std::move(entry);
    }
  }
  state.values["type"] = K::kName;
  state.values["param_groups"] = std::move(groups);
  state.values["state"] = std::move(states);
  return state;
}

// A mismatch line for a param group whose saved parameter names differ from `here`.
std::string ParamsMismatch(const std::string& what, const std::vector<std::string>& saved,
                           const std::vector<std::string>& here) {
  if (saved.size() != here.size()) {
    return absl::StrCat(what, ".params: ", saved.size(), " parameters in the checkpoint, ",
                        here.size(), " here");
  }
  size_t j = 0;
  while (saved[j] == here[j]) ++j;
  return absl::StrCat(what, ".params[", j, "]: '", saved[j], "' in the checkpoint, '", here[j],
                      "' here");
}

template <typename K>
absl::Status LoadOptimizer(const Json& values, StateReader& reader,
                           torch::optim::Optimizer& optimizer, const Names& names,
                           const Placements& placements) {
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
  if (type != K::kName) {
    reader.ReportMismatch(absl::StrCat("type: ", type, " in the checkpoint, ", K::kName, " here"));
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
    if (saved_names != names[i]) {
      reader.ReportMismatch(ParamsMismatch(what, saved_names, names[i]));
      fits = false;
    }
  }
  const Json& saved_states = values["state"];
  if (!saved_states.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state must be a JSON object, got ", saved_states.dump()));
  }
  if (!fits) return absl::OkStatus();

  std::set<std::string> all_names;
  for (const std::vector<std::string>& group_names : names) {
    all_names.insert(group_names.begin(), group_names.end());
  }
  for (const auto& item : saved_states.items()) {
    if (all_names.count(item.key()) == 0) {
      reader.ReportMismatch(
          absl::StrCat("state: '", item.key(), "' is not a parameter of the optimizer"));
    }
  }

  std::vector<std::pair<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
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
                  PlacementOf(placements, name), reader));
      if (param_state != nullptr) loaded.emplace_back(StateKey(param), std::move(param_state));
    }
  }

  if (reader.checking()) return absl::OkStatus();
  for (size_t i = 0; i < groups.size(); ++i) {
    K::Apply(saved_options[i], *options[i]);
    for (const at::Tensor& param : groups[i].params()) optimizer.state().erase(StateKey(param));
  }
  for (auto& [key, param_state] : loaded) optimizer.state()[key] = std::move(param_state);
  return absl::OkStatus();
}

}  // namespace

OptimizerState::OptimizerState(Kind kind, torch::nn::Module* model, NamedTensors named,
                               torch::optim::Optimizer& optimizer, optim::ParamScheduler* scheduler,
                               std::map<std::string, ShardPlacement> placements)
    : kind_(kind),
      model_(model),
      named_(std::move(named)),
      optimizer_(&optimizer),
      scheduler_(scheduler),
      placements_(std::move(placements)) {}

absl::StatusOr<OptimizerState> OptimizerState::Create(
    torch::nn::Module& model, torch::optim::Optimizer& optimizer, optim::ParamScheduler* scheduler,
    std::map<std::string, ShardPlacement> placements) {
  const auto params = model.named_parameters(/*recurse=*/true);
  for (const auto& [name, placement] : placements) {
    if (params.find(name) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("placements: '", name, "' is not a parameter of the model"));
    }
  }
  return Make(&model, {}, optimizer, scheduler, std::move(placements));
}

absl::StatusOr<OptimizerState> OptimizerState::Create(optim::DistributedOptimizer& optimizer,
                                                      optim::ParamScheduler* scheduler) {
  NamedTensors named;
  std::map<std::string, ShardPlacement> placements;
  for (const gradients::ParamShard& shard : optimizer.shards()) {
    named.emplace_back(shard.name, shard.tensor);
    std::vector<int64_t> offsets(shard.global_shape.size(), 0);
    offsets[0] = shard.row_begin;
    placements[shard.name] = ShardPlacement{shard.global_shape, std::move(offsets)};
  }
  return Make(nullptr, std::move(named), optimizer.optimizer(), scheduler, std::move(placements));
}

absl::StatusOr<OptimizerState> OptimizerState::Make(
    torch::nn::Module* model, NamedTensors named, torch::optim::Optimizer& optimizer,
    optim::ParamScheduler* scheduler, std::map<std::string, ShardPlacement> placements) {
  Kind kind;
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    kind = Kind::kAdam;
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    kind = Kind::kAdamW;
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    kind = Kind::kSgd;
  } else {
    return absl::InvalidArgumentError(
        "the optimizer must be a torch::optim::Adam, AdamW or SGD; other types are not "
        "supported");
  }
  OptimizerState state(kind, model, std::move(named), optimizer, scheduler, std::move(placements));
  KEEL_RETURN_IF_ERROR(state.GroupParamNames().status());
  return state;
}

absl::StatusOr<std::vector<std::vector<std::string>>> OptimizerState::GroupParamNames() const {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  if (model_ != nullptr) {
    for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
      names.emplace(item.value().unsafeGetTensorImpl(), item.key());
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
  absl::StatusOr<State> state;
  switch (kind_) {
    case Kind::kAdam:
      state = SaveOptimizer<AdamKind>(*optimizer_, names, placements_);
      break;
    case Kind::kAdamW:
      state = SaveOptimizer<AdamWKind>(*optimizer_, names, placements_);
      break;
    case Kind::kSgd:
      state = SaveOptimizer<SgdKind>(*optimizer_, names, placements_);
      break;
  }
  if (state.ok() && scheduler_ != nullptr) {
    state->values["sched"] = base::WriteJsonFields(scheduler_->StateDict());
  }
  return state;
}

absl::Status OptimizerState::LoadStateDict(StateReader& reader) {
  KEEL_ASSIGN_OR_RETURN(Names names, GroupParamNames());
  const Json& values = reader.Values();
  // An empty object: nothing was saved under this name, which the reader has reported.
  if (values.empty()) return absl::OkStatus();
  switch (kind_) {
    case Kind::kAdam:
      KEEL_RETURN_IF_ERROR(
          LoadOptimizer<AdamKind>(values, reader, *optimizer_, names, placements_));
      break;
    case Kind::kAdamW:
      KEEL_RETURN_IF_ERROR(
          LoadOptimizer<AdamWKind>(values, reader, *optimizer_, names, placements_));
      break;
    case Kind::kSgd:
      KEEL_RETURN_IF_ERROR(LoadOptimizer<SgdKind>(values, reader, *optimizer_, names, placements_));
      break;
  }
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
