#include "optim/internal/param_scheduler_json.h"

#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace keel::optim::internal {
namespace {

using base::Json;

// Reads the first of `keys` present in `dict` into `out`.
template <typename T>
absl::Status ReadFirstOf(const Json& dict, std::initializer_list<const char*> keys, T& out) {
  for (const char* key : keys) {
    auto it = dict.find(key);
    if (it != dict.end()) return base::FromJson(*it, absl::StrCat("state_dict.", key), out);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("state_dict has none of the keys ", absl::StrJoin(keys, ", ")));
}

}  // namespace

absl::StatusOr<ParamSchedulerState> ParamSchedulerStateFromJson(const Json& dict) {
  if (!dict.is_object()) {
    return absl::InvalidArgumentError("state_dict must be a JSON object");
  }
  ParamSchedulerState state;
  KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"start_lr", "max_lr"}, state.max_lr));
  KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"min_lr"}, state.min_lr));
  KEEL_RETURN_IF_ERROR(
      ReadFirstOf(dict, {"warmup_iter", "warmup_steps", "lr_warmup_steps"}, state.lr_warmup_steps));
  KEEL_RETURN_IF_ERROR(
      ReadFirstOf(dict, {"end_iter", "decay_steps", "lr_decay_steps"}, state.lr_decay_steps));
  KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"decay_style", "lr_decay_style"}, state.lr_decay_style));
  KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"num_iters", "num_steps"}, state.num_steps));
  if (dict.contains("start_wd")) {
    state.start_wd.emplace();
    state.end_wd.emplace();
    state.wd_incr_steps.emplace();
    state.wd_incr_style.emplace();
    KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"start_wd"}, *state.start_wd));
    KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"end_wd"}, *state.end_wd));
    KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"wd_incr_steps"}, *state.wd_incr_steps));
    KEEL_RETURN_IF_ERROR(ReadFirstOf(dict, {"wd_incr_style"}, *state.wd_incr_style));
  }
  return state;
}

Json ParamSchedulerStateToJson(const ParamSchedulerState& state) {
  return base::WriteJsonFields(state);
}

}  // namespace keel::optim::internal
