#include "tools/recipe/numerics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

std::string Value(double value) { return base::ToJson(value).dump(); }

// "the <what> is non-finite on rank 1 (nan), rank 3 (inf)", or "" when it is finite on every
// rank.
std::string NonFiniteRanks(const at::Tensor& values, const std::string& what) {
  std::vector<std::string> bad;
  for (int64_t r = 0; r < values.size(0); ++r) {
    const double value = values[r].item<double>();
    if (!std::isfinite(value)) bad.push_back(absl::StrCat("rank ", r, " (", Value(value), ")"));
  }
  if (bad.empty()) return "";
  return absl::StrCat(what, " non-finite on ", absl::StrJoin(bad, ", "));
}

}  // namespace

absl::StatusOr<std::string> NonFiniteGuard::Describe(int64_t step, double grad_norm,
                                                     const Local& local,
                                                     const TrainRuntime& runtime) const {
  // Each rank's loss and gradient sum in its own slots; the others add zeros, so a NaN stays in
  // its rank's slot.
  at::Tensor contributed = at::zeros({2, runtime.world_size}, at::kDouble);
  contributed[0][runtime.rank] = local.loss;
  contributed[1][runtime.rank] =
      local.gradient_sum.defined() ? local.gradient_sum.item<double>() : grad_norm;
  KEEL_RETURN_IF_ERROR(ReduceOverRanks(contributed, base::Reduce::kSum, runtime,
                                       "what each rank contributed to the step"));
  std::vector<std::string> parts = {NonFiniteRanks(contributed[0], "the loss is"),
                                    NonFiniteRanks(contributed[1], "the gradients are")};
  parts.erase(std::remove(parts.begin(), parts.end(), ""), parts.end());
  if (parts.empty()) parts.push_back("every rank's loss and gradients are finite");
  return absl::StrCat("step ", step, ": ", absl::StrJoin(parts, "; "), "; the gradient norm is ",
                      Value(grad_norm));
}

absl::StatusOr<NonFiniteGuard::Verdict> NonFiniteGuard::Check(int64_t step, double loss,
                                                              double grad_norm, const Local& local,
                                                              const TrainRuntime& runtime) {
  if (!options_.check_for_nan_in_loss_and_grad ||
      (std::isfinite(loss) && std::isfinite(grad_norm))) {
    state_.consecutive_skipped_steps = 0;
    return Verdict::kStep;
  }
  KEEL_ASSIGN_OR_RETURN(const std::string what, Describe(step, grad_norm, local, runtime));
  if (options_.on_nonfinite == NonFinitePolicy::kStop) {
    return absl::AbortedError(absl::StrCat(
        what,
        ". Stopped before the optimizer step (numerics.check_for_nan_in_loss_and_grad): no "
        "checkpoint holds this state, so the newest one is the last good state and a rerun "
        "resumes from it. A lower learning rate (lr_scheduler.max_lr) or clipping "
        "(clip_grad.max_norm) may help; numerics.on_nonfinite=skip drops such steps instead"));
  }
  ++state_.skipped_steps;
  if (++state_.consecutive_skipped_steps >= options_.max_consecutive_skipped_steps) {
    return absl::AbortedError(absl::StrCat(
        what, ". That is ", state_.consecutive_skipped_steps,
        " skipped steps in a row (numerics.max_consecutive_skipped_steps): the run has diverged; "
        "stopped before the optimizer step, so the newest checkpoint is the last good state"));
  }
  if (runtime.rank == 0) {
    *runtime.log << "warning: " << what << ". The step is skipped on every rank (numerics."
                 << "on_nonfinite=skip; " << state_.skipped_steps << " skipped so far, "
                 << state_.consecutive_skipped_steps << " in a row)\n";
  }
  return Verdict::kSkip;
}

absl::StatusOr<checkpoint::State> NonFiniteGuard::StateDict() const {
  checkpoint::State state;
  state.values = base::WriteJsonFields(state_);
  return state;
}

absl::Status NonFiniteGuard::LoadStateDict(checkpoint::StateReader& reader) {
  NumericsState loaded;
  if (reader.HasValues()) {
    KEEL_RETURN_IF_ERROR(base::ReadJsonFields(reader.Values(), loaded));
  }
  if (!reader.checking()) state_ = loaded;
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
