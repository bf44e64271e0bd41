// Plain Statefuls over named tensors and values, for the checkpoint tests.
#ifndef KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_
#define KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

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

// Saves `values`; a load keeps what StateReader::ValuesOfEachRank offers (every saving rank's
// values), and the saved world size, for a test to look at, as an object that merges values
// saved per rank would read them.
class EachRankValues : public Stateful {
 public:
  base::Json values = base::Json::object();
  std::vector<base::Json> each_rank;
  int saved_world_size = 0;

  absl::StatusOr<State> StateDict() const override {
    State state;
    state.values = values;
    return state;
  }

  absl::Status LoadStateDict(StateReader& reader) override {
    std::vector<base::Json> each = reader.ValuesOfEachRank();
    if (reader.checking()) return absl::OkStatus();
    each_rank = std::move(each);
    saved_world_size = reader.saved_world_size();
    return absl::OkStatus();
  }
};

}  // namespace keel::checkpoint::testing

#endif  // KEEL_CHECKPOINT_CHECKPOINT_TESTUTIL_H_
