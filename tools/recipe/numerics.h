// The trainer's guard against non-finite values, after Megatron's
// check_for_nan_in_loss_and_grad (megatron/training/training.py, megatron/core/distributed):
// between the backward passes and the optimizer step, a non-finite loss or gradient norm on any
// rank stops the run, so no checkpoint of that state or a later one is written, and the newest
// checkpoint is the last good state; or, with numerics.on_nonfinite "skip", the step is dropped
// on every rank (no update), counted in the metrics and in checkpoints ("numerics"), until
// max_consecutive_skipped_steps in a row stop the run.
//
//   NonFiniteGuard guard(options.numerics);
//   KEEL_ASSIGN_OR_RETURN(NonFiniteGuard::Verdict verdict,
//                         guard.Check(step, loss, grad_norm, {local_loss, grad_sum}, runtime));
//   if (verdict == NonFiniteGuard::Verdict::kSkip) ... else optimizer.Step();
#ifndef KEEL_TOOLS_RECIPE_NUMERICS_H_
#define KEEL_TOOLS_RECIPE_NUMERICS_H_

#include <cstdint>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/fields.h"
#include "checkpoint/state_dict.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

// The skips a checkpoint holds.
struct NumericsState {
  // Steps skipped since the run began, and in a row up to the last step.
  int64_t skipped_steps = 0;
  int64_t consecutive_skipped_steps = 0;
};

template <typename O, typename V, base::IsFieldsOf<O, NumericsState> = 0>
void VisitFields(O& o, V&& v) {
  v("skipped_steps", o.skipped_steps);
  v("consecutive_skipped_steps", o.consecutive_skipped_steps);
}

class NonFiniteGuard : public checkpoint::Stateful {
 public:
  enum class Verdict { kStep, kSkip };

  explicit NonFiniteGuard(const NumericsOptions& options) : options_(options) {}

  // What one rank contributed to a step, to name the rank(s) where a value went bad.
  struct Local {
    // This rank's part of the loss.
    double loss = 0.0;
    // The sum of this rank's gradients before the data-parallel reduction
    // (DataParallelGradSync::LocalGradientSum); undefined on one rank, where the reduced
    // gradient norm is this rank's own.
    at::Tensor gradient_sum;
  };

  // Judges step `step` (1-based) from its loss and gradient norm, which every rank holds alike
  // (reduced over the ranks): kStep when both are finite or the check is off; kSkip under the
  // "skip" policy. A non-finite value is seen by every rank at once, which then exchange what
  // each contributed to name the rank(s) where the loss or the gradients went bad.
  // Collective: over runtime.control_group(), only when a value is non-finite. Errors: kAborted
  // naming the step, the ranks and the values when the run must stop (the "stop" policy, or
  // max_consecutive_skipped_steps reached); kUnavailable from peers.
  [[nodiscard]] absl::StatusOr<Verdict> Check(int64_t step, double loss, double grad_norm,
                                              const Local& local, const TrainRuntime& runtime);

  const NumericsState& state() const { return state_; }
  // Back to no skips (a new run).
  void Reset() { state_ = {}; }

  [[nodiscard]] absl::StatusOr<checkpoint::State> StateDict() const override;
  // A checkpoint written before Keel counted skips holds nothing under this name: no skips.
  [[nodiscard]] absl::Status LoadStateDict(checkpoint::StateReader& reader) override;

 private:
  // What went wrong at `step`: the ranks whose loss or gradients are non-finite, with their
  // values, and the gradient norm. Collective: over runtime.control_group().
  absl::StatusOr<std::string> Describe(int64_t step, double grad_norm, const Local& local,
                                       const TrainRuntime& runtime) const;

  NumericsOptions options_;
  NumericsState state_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_NUMERICS_H_
