#include "scheduling/step_scheduler_cases.h"

#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "scheduling/preemption.h"
#include "scheduling/step_scheduler.h"

namespace keel::scheduling {
namespace {

using base::Json;

// The golden harness's loader: a pass yields i = skip..num_batches-1, plus 1000 times the
// last epoch given to set_epoch when it has a sampler with set_epoch.
struct LoaderState {
  int64_t num_batches = 0;
  bool sampler_set_epoch = false;
  int64_t skip_first_pass = 0;
  int64_t last_epoch = 0;
  int64_t position = 0;  // items handed out in the current pass
  int passes = 0;
  Json set_epoch_calls = Json::array();
};

class LoaderIterator {
 public:
  LoaderIterator(LoaderState* state, int64_t index) : state_(state), index_(index) {}
  int64_t operator*() const {
    state_->position = index_ + 1;
    return index_ + (state_->sampler_set_epoch ? 1000 * state_->last_epoch : 0);
  }
  LoaderIterator& operator++() {
    ++index_;
    return *this;
  }
  bool operator!=(const LoaderIterator& other) const { return index_ != other.index_; }

 private:
  LoaderState* state_;
  int64_t index_;
};

class Loader {
 public:
  explicit Loader(LoaderState* state) : state_(state) {}
  LoaderIterator begin() {
    const int64_t start = state_->passes++ == 0 ? state_->skip_first_pass : 0;
    state_->position = start;
    return LoaderIterator(state_, start);
  }
  LoaderIterator end() { return LoaderIterator(state_, state_->num_batches); }
  void SetEpoch(int64_t epoch) {
    if (!state_->sampler_set_epoch) return;  // that loader has no set_epoch
    state_->last_epoch = epoch;
    state_->set_epoch_calls.push_back(epoch);
  }

 protected:
  LoaderState* state_;
};

// A loader with len(): its length is num_batches.
class SizedLoader : public Loader {
 public:
  using Loader::Loader;
  int64_t size() const { return state_->num_batches; }
};

struct Case {
  StepSchedulerOptions options;
  int64_t dp_size = 0;
  int64_t local_batch_size = 0;
  LoaderState loader;
  bool has_len = true;
  bool run_loop = true;
  std::optional<int> raise_signal;
  int64_t raise_phase = 0;
  int64_t raise_after_group = 0;
  std::optional<int64_t> stop_after_groups;
  int64_t dataloader_skip = 0;
};

// preemption_signal as NeMo accepts it: null, a number, a name, or a list of those.
absl::Status ReadSignals(const Json& json, std::optional<std::vector<std::string>>& out) {
  if (json.is_null()) {
    out.reset();
    return absl::OkStatus();
  }
  std::vector<std::string> specs;
  for (const Json& spec : json.is_array() ? json : Json::array({json})) {
    if (spec.is_number_integer()) {
      specs.push_back(absl::StrCat(spec.get<int64_t>()));
    } else if (spec.is_string()) {
      specs.push_back(spec.get<std::string>());
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("Signal must be an int, str or signal.Signals, got ", spec.type_name(), ": ",
                       spec.dump()));
    }
  }
  out = std::move(specs);
  return absl::OkStatus();
}

absl::StatusOr<Case> ReadCase(const Json& inputs) {
  Case c;
  const bool config_form = inputs.contains("config");
  if (!config_form) {  // the StepScheduler constructor's own defaults
    c.options.num_epochs.reset();
    c.options.ckpt_every_steps.reset();
  }
  const Json& fields = config_form ? inputs["config"] : inputs;
  Json without_signal = fields;
  without_signal.erase("preemption_signal");
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(without_signal, c.options, "inputs."));
  if (fields.contains("preemption_signal")) {
    KEEL_RETURN_IF_ERROR(ReadSignals(fields["preemption_signal"], c.options.preemption_signal));
  }
  KEEL_RETURN_IF_ERROR(
      base::FromJson(inputs.value(config_form ? "dp_group_size" : "dp_size", Json()),
                     "inputs.dp_size", c.dp_size));
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("local_batch_size", Json()),
                                      "inputs.local_batch_size", c.local_batch_size));
  const Json loader = inputs.value("dataloader", Json::object());
  KEEL_RETURN_IF_ERROR(base::FromJson(loader.value("num_batches", Json()),
                                      "inputs.dataloader.num_batches", c.loader.num_batches));
  KEEL_RETURN_IF_ERROR(
      base::FromJson(loader.value("has_len", Json(true)), "inputs.dataloader.has_len", c.has_len));
  KEEL_RETURN_IF_ERROR(base::FromJson(loader.value("sampler_set_epoch", Json(false)),
                                      "inputs.dataloader.sampler_set_epoch",
                                      c.loader.sampler_set_epoch));
  KEEL_RETURN_IF_ERROR(
      base::FromJson(inputs.value("run_loop", Json(true)), "inputs.run_loop", c.run_loop));
  if (inputs.contains("raise_signal")) {
    const Json& raise = inputs["raise_signal"];
    std::string name;
    KEEL_RETURN_IF_ERROR(
        base::FromJson(raise.value("signal", Json()), "inputs.raise_signal.signal", name));
    KEEL_ASSIGN_OR_RETURN(std::vector<int> signals, ResolveSignals({name}));
    c.raise_signal = signals[0];
    KEEL_RETURN_IF_ERROR(
        base::FromJson(raise.value("phase", Json(0)), "inputs.raise_signal.phase", c.raise_phase));
    KEEL_RETURN_IF_ERROR(base::FromJson(raise.value("after_group", Json()),
                                        "inputs.raise_signal.after_group", c.raise_after_group));
    std::vector<int> handled;
    if (c.options.preemption_signal.has_value()) {
      absl::StatusOr<std::vector<int>> resolved = ResolveSignals(*c.options.preemption_signal);
      if (resolved.ok()) handled = *resolved;
    }
    if (std::find(handled.begin(), handled.end(), *c.raise_signal) == handled.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs.raise_signal.signal ", name,
                       " is not a preemption_signal: raising it would end the process"));
    }
  }
  if (inputs.contains("resume")) {
    const Json& resume = inputs["resume"];
    int64_t k = 0;
    KEEL_RETURN_IF_ERROR(base::FromJson(resume.value("stop_after_groups", Json()),
                                        "inputs.resume.stop_after_groups", k));
    c.stop_after_groups = k;
    KEEL_RETURN_IF_ERROR(base::FromJson(resume.value("dataloader_skip", Json(0)),
                                        "inputs.resume.dataloader_skip", c.dataloader_skip));
  }
  return c;
}

Json Derived(const StepSchedule& s) {
  const StepSchedulerOptions& o = s.options();
  return Json{{"grad_acc_steps", s.grad_acc_steps()},
              {"epoch_len", base::ToJson(s.epoch_len())},
              {"num_epochs", s.num_epochs()},
              {"max_steps", s.max_steps()},
              {"ckpt_every_steps", s.ckpt_every_steps()},
              {"save_checkpoint_every_epoch", o.save_checkpoint_every_epoch},
              {"val_every_steps", base::ToJson(o.val_every_steps)},
              {"log_remote_every_steps", o.log_remote_every_steps},
              {"loss_average_window_steps", o.loss_average_window_steps},
              {"gc_every_steps", base::ToJson(o.gc_every_steps)},
              {"step", s.step()},
              {"epoch", s.epoch()}};
}

// One phase of the recipe loop; returns whether it stopped early for a resume.
template <typename Source>
bool RunLoop(const Case& c, int phase, StepScheduler<Source>& scheduler, Json& phase_json,
             Json& trace) {
  Json epochs_yielded = Json::array();
  int64_t groups = 0;
  bool stopped = false;
  for (int64_t epoch : scheduler.Epochs()) {
    epochs_yielded.push_back(epoch);
    scheduler.SetEpoch(epoch);
    for (auto& batches : scheduler) {
      ++groups;
      if (c.raise_signal.has_value() && c.raise_phase == phase && c.raise_after_group == groups) {
        raise(*c.raise_signal);
      }
      // The flags are read in the harness's order: polling preemption depends on it.
      Json record = {{"phase", phase},
                     {"step", scheduler.step()},
                     {"epoch", scheduler.epoch()},
                     {"num_micro_batches", batches.size()},
                     {"batches", batches}};
      const bool is_ckpt_step = scheduler.IsCkptStep();
      record["is_ckpt_step"] = is_ckpt_step;
      record["is_val_step"] = scheduler.IsValStep();
      record["is_last_step"] = scheduler.IsLastStep();
      record["is_last_batch"] = scheduler.IsLastBatch();
      record["is_gc_step"] = scheduler.IsGcStep();
      record["is_remote_logging_step"] = scheduler.IsRemoteLoggingStep();
      record["sigterm_received"] = scheduler.SigtermReceived();
      if (is_ckpt_step) record["state_dict"] = base::WriteJsonFields(scheduler.StateDict());
      trace.push_back(std::move(record));
      if (phase == 0 && c.stop_after_groups == groups) {
        stopped = true;
        break;
      }
    }
    if (stopped) break;
  }
  phase_json["epochs_yielded"] = std::move(epochs_yielded);
  phase_json["groups"] = groups;
  return stopped;
}

template <typename Source>
absl::StatusOr<Json> Run(Case& c) {
  Json phases = Json::array();
  Json trace = Json::array();
  std::optional<StepSchedulerState> saved;
  Json final_state;
  for (int phase = 0; phase < (c.stop_after_groups.has_value() ? 2 : 1); ++phase) {
    LoaderState loader_state = c.loader;
    loader_state.skip_first_pass = phase == 0 ? 0 : c.dataloader_skip;
    Source source(&loader_state);
    KEEL_ASSIGN_OR_RETURN(StepScheduler<Source> scheduler,
                          BuildStepScheduler(c.options, source, c.dp_size, c.local_batch_size));
    Json phase_json = {{"derived", Derived(scheduler)}};
    if (!c.run_loop) return Json{{"phases", Json::array({std::move(phase_json)})}};
    if (saved.has_value()) {
      KEEL_RETURN_IF_ERROR(scheduler.LoadStateDict(*saved));
      phase_json["after_load_state_dict"] = {{"step", scheduler.step()},
                                             {"epoch", scheduler.epoch()}};
    }
    if (RunLoop(c, phase, scheduler, phase_json, trace)) {
      saved = scheduler.StateDict();
      phase_json["state_dict_at_stop"] = base::WriteJsonFields(*saved);
      phase_json["dataloader_pos_at_stop"] = loader_state.position;
    }
    if (c.loader.sampler_set_epoch) phase_json["set_epoch_calls"] = loader_state.set_epoch_calls;
    phases.push_back(std::move(phase_json));
    final_state = {{"step", scheduler.step()},
                   {"epoch", scheduler.epoch()},
                   {"state_dict", base::WriteJsonFields(scheduler.StateDict())}};
    final_state["is_last_step"] = scheduler.IsLastStep();
    final_state["is_ckpt_step"] = scheduler.IsCkptStep();
    final_state["is_last_batch"] = scheduler.IsLastBatch();
    final_state["sigterm_received"] = scheduler.SigtermReceived();
  }
  return Json{{"phases", std::move(phases)},
              {"trace", std::move(trace)},
              {"final", std::move(final_state)}};
}

}  // namespace

absl::StatusOr<Json> RunStepSchedulerCase(const Json& inputs) {
  KEEL_ASSIGN_OR_RETURN(Case c, ReadCase(inputs));
  return c.has_len ? Run<SizedLoader>(c) : Run<Loader>(c);
}

}  // namespace keel::scheduling
