#include "optim/param_scheduler_cases.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "optim/internal/param_scheduler_json.h"
#include "optim/param_scheduler.h"
#include "torch/optim/adamw.h"
#include "torch/types.h"

namespace keel::optim {
namespace {

using base::Json;
using internal::ParamSchedulerStateFromJson;
using internal::ParamSchedulerStateToJson;

// The groups' current lr and weight decay, as the golden traces record them.
void RecordGroups(torch::optim::Optimizer& optimizer, Json& record) {
  Json lr = Json::array();
  Json weight_decay = Json::array();
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    lr.push_back(base::DoubleToJson(options.lr()));
    weight_decay.push_back(base::DoubleToJson(options.weight_decay()));
  }
  record["lr"] = std::move(lr);
  record["weight_decay"] = std::move(weight_decay);
}

absl::StatusOr<ParamGroupOverrides> ReadGroup(const Json& group, const std::string& what) {
  // Other keys of a Python param group (lr, weight_decay, default_config) are not overrides.
  ParamGroupOverrides overrides;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(group, overrides, what + "."));
  return overrides;
}

absl::Status RunOp(const Json& op, const std::string& what, ParamScheduler& scheduler,
                   torch::optim::Optimizer& optimizer, Json& trace) {
  std::string name;
  KEEL_RETURN_IF_ERROR(base::FromJson(op.value("op", Json()), what + ".op", name));
  if (name == "step") {
    int64_t increment = 0;
    int64_t repeat = 1;
    KEEL_RETURN_IF_ERROR(
        base::FromJson(op.value("increment", Json()), what + ".increment", increment));
    if (op.contains("repeat")) {
      KEEL_RETURN_IF_ERROR(base::FromJson(op["repeat"], what + ".repeat", repeat));
    }
    if (increment < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".increment (", increment, ") must be >= 0"));
    }
    for (int64_t i = 0; i < repeat; ++i) {
      KEEL_RETURN_IF_ERROR(scheduler.Step(increment));
      Json record = {
          {"op", "step"}, {"increment", increment}, {"num_steps", scheduler.num_steps()}};
      RecordGroups(optimizer, record);
      trace.push_back(std::move(record));
    }
  } else if (name == "state_dict") {
    trace.push_back(
        {{"op", "state_dict"}, {"state_dict", ParamSchedulerStateToJson(scheduler.StateDict())}});
  } else if (name == "load_state_dict") {
    KEEL_ASSIGN_OR_RETURN(ParamSchedulerState state,
                          ParamSchedulerStateFromJson(op.value("state_dict", Json())));
    KEEL_RETURN_IF_ERROR(scheduler.LoadStateDict(state));
    Json record = {{"op", "load_state_dict"}, {"num_steps", scheduler.num_steps()}};
    RecordGroups(optimizer, record);
    record["state_dict"] = ParamSchedulerStateToJson(scheduler.StateDict());
    trace.push_back(std::move(record));
  } else if (name == "get_lr" || name == "get_wd") {
    ParamGroupOverrides group;
    const Json param_group = op.value("param_group", Json());
    if (!param_group.is_null()) {
      KEEL_ASSIGN_OR_RETURN(group, ReadGroup(param_group, what + ".param_group"));
    }
    double value = 0.0;
    if (name == "get_lr") {
      value = scheduler.GetLr(group);
    } else {
      KEEL_RETURN_IF_ERROR(Validate(scheduler.options(), group));
      value = scheduler.GetWd(group);
    }
    trace.push_back({{"op", name}, {"value", base::DoubleToJson(value)}});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".op \"", name,
                     "\" is not one of step, state_dict, load_state_dict, get_lr, get_wd"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Json> RunParamSchedulerCase(const Json& inputs) {
  ParamSchedulerOptions options;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(inputs, options, "inputs."));

  const Json groups = inputs.value("param_groups", Json::array());
  if (!groups.is_array() || groups.empty()) {
    return absl::InvalidArgumentError("inputs.param_groups must be a non-empty array");
  }
  std::vector<ParamGroupOverrides> overrides;
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (size_t i = 0; i < groups.size(); ++i) {
    KEEL_ASSIGN_OR_RETURN(ParamGroupOverrides group,
                          ReadGroup(groups[i], absl::StrCat("inputs.param_groups[", i, "]")));
    overrides.push_back(group);
    param_groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({1})});
  }
  torch::optim::AdamW optimizer(std::move(param_groups), torch::optim::AdamWOptions());
  KEEL_ASSIGN_OR_RETURN(ParamScheduler scheduler,
                        ParamScheduler::Create(options, optimizer, std::move(overrides)));

  Json after_init = {{"num_steps", scheduler.num_steps()}};
  RecordGroups(optimizer, after_init);
  Json trace = Json::array();
  const Json ops = inputs.value("ops", Json::array());
  for (size_t i = 0; i < ops.size(); ++i) {
    KEEL_RETURN_IF_ERROR(
        RunOp(ops[i], absl::StrCat("inputs.ops[", i, "]"), scheduler, optimizer, trace));
  }
  return Json{{"after_init", std::move(after_init)}, {"trace", std::move(trace)}};
}

}  // namespace keel::optim
