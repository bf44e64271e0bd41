// A plain Stateful over named tensors and values, for the checkpoint tests.
#ifndef KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_
#define KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_

#include <map>
#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "base/json.h"
#include "base/status.h"
#include "checkpoint/state_dict.h"

namespace keel::checkpoint::testing {

// Saves its tensors and values; loads them back in place (tensors) and by assignment (values).
class TensorsState : public Stateful {
 public:
  std::map<std::string, TensorRef> tensors;
  base::Json values = base::Json::object();

  absl::StatusOr<State> StateDict() const override {
    State state;
    state.tensors = tensors;
    state.values = values;
    return state;
  }

  absl::Status LoadStateDict(StateReader& reader) override {
    for (const auto& [key, ref] : tensors) KEEL_RETURN_IF_ERROR(reader.ReadTensor(key, ref));
    // Empty when nothing was saved under this name (the reader reports it): keep ours.
    if (!reader.Values().empty() && !reader.checking()) values = reader.Values();
    return absl::OkStatus();
  }

  // A copy with the same shapes, dtypes and layouts, filled with `fill`.
  TensorsState EmptyLike(double fill = -7) const {
    TensorsState copy;
    for (const auto& [key, ref] : tensors) {
      copy.tensors[key] = {at::full_like(ref.tensor, fill), ref.layout};
    }
    return copy;
  }
};

}  // namespace keel::checkpoint::testing

#endif  // KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_
