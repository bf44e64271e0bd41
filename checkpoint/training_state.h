// Small Stateful adapters for the rest of a training run's state, as NeMo AutoModel's
// checkpoints hold it beside the model and optimizer: a plain state struct with VisitFields
// (StepScheduler.state_dict(), the samplers' state, user values) behind a getter and a
// setter, and the default CPU generator's state per rank (the RNG state of NeMo's
// StatefulRNG). Neither makes checkpoint/ depend on the packages whose state they carry.
//
//   keel::checkpoint::ValueState<keel::scheduling::StepSchedulerState> step_state(
//       [&] { return scheduler.StateDict(); },
//       [&](const auto& s) { return scheduler.LoadStateDict(s); });
//   keel::checkpoint::RngState rng(/*rank=*/rank, /*world_size=*/world_size);
//   Statefuls statefuls = {{"step_scheduler", &step_state}, {"rng", &rng}};
#ifndef KEEL_CHECKPOINT_TRAINING_STATE_H_
#define KEEL_CHECKPOINT_TRAINING_STATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/core/Generator.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "checkpoint/state_dict.h"

namespace keel::checkpoint {

// A state struct S with a VisitFields overload (see base/fields.h) as a Stateful: StateDict
// saves get() as values, one per field (get's error, if it has one, is StateDict's); LoadStateDict
// reads every field and passes the result to set(). A field absent from the checkpoint is reported
// missing and set() is not called; saved values that name no field are ignored.
template <typename S>
class ValueState : public Stateful {
 public:
  // Requires: whatever `get` and `set` refer to outlives this object.
  ValueState(std::function<absl::StatusOr<S>()> get, std::function<absl::Status(const S&)> set)
      : get_(std::move(get)), set_(std::move(set)) {}

  [[nodiscard]] absl::StatusOr<State> StateDict() const override {
    absl::StatusOr<S> value = get_();
    if (!value.ok()) return value.status();
    State state;
    state.values = base::WriteJsonFields(*value);
    return state;
  }

  // Errors: kInvalidArgument for an ill-typed value (naming the field); whatever set()
  // returns.
  [[nodiscard]] absl::Status LoadStateDict(StateReader& reader) override {
    const base::Json& values = reader.Values();
    // An empty object: nothing was saved under this name, which the reader has reported.
    if (values.empty()) return absl::OkStatus();
    S state{};
    bool complete = true;
    VisitFields(state, [&](absl::string_view name, auto& /*field*/) {
      if (!values.contains(std::string(name))) {
        reader.ReportMissing(std::string(name));
        complete = false;
      }
    });
    if (!complete) return absl::OkStatus();
    if (absl::Status status = base::ReadJsonFields(values, state); !status.ok()) return status;
    if (reader.checking()) return absl::OkStatus();
    return set_(state);
  }

 private:
  std::function<absl::StatusOr<S>()> get_;
  std::function<absl::Status(const S&)> set_;
};

struct RngStateOptions {
  // What a load of a checkpoint saved by another number of ranks does. false: a mismatch on
  // every rank, so a strict load fails alike everywhere (a non-strict one restores the saved
  // row `rank` where there is one). true: nothing is restored and nothing reported, and
  // saved_world_size() tells the caller, who seeds the generators its own way (an elastic
  // resume). Default: false.
  bool allow_world_size_change = false;
};

// The state of a CPU generator, by default LibTorch's default CPU generator (the one
// torch::manual_seed seeds and torch::randn uses), for one of `world_size` ranks.
//
// Saved as the uint8 tensor "cpu" of global shape [world_size, n] (n: the generator's state
// size), whose row `rank` is this rank's block, so each rank restores its own stream. For a
// checkpoint saved with another number of ranks, see RngStateOptions.
class RngState : public Stateful {
 public:
  // Requires: 0 <= rank < world_size; `generator` is a CPU generator.
  RngState(int64_t rank, int64_t world_size,
           at::Generator generator = at::detail::getDefaultCPUGenerator(),
           RngStateOptions options = {});

  [[nodiscard]] absl::StatusOr<State> StateDict() const override;
  // Errors: kDataLoss when the generator rejects the saved bytes; those of ReadTensor.
  [[nodiscard]] absl::Status LoadStateDict(StateReader& reader) override;

  // The number of ranks that saved the last checkpoint loaded (nullopt before a load, or when
  // it held no RNG state).
  std::optional<int64_t> saved_world_size() const { return saved_world_size_; }

 private:
  int64_t rank_;
  int64_t world_size_;
  at::Generator generator_;
  RngStateOptions options_;
  std::optional<int64_t> saved_world_size_;
};

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_TRAINING_STATE_H_
