// Runs one grad_utils golden case (testdata/golden/grad_utils.json) through Keel, for the
// parity test and //tools:parity: count_tail_padding, clip_grad_norm (model parts of
// parameters with gradients) and _clip_grad_norm_impl. See testdata/golden/README.md.
#ifndef KEEL_GRADIENTS_GRAD_UTILS_CASES_H_
#define KEEL_GRADIENTS_GRAD_UTILS_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::gradients {

// Returns {result} or {total_norm, total_norm_kind, grads}. Errors: as the function's.
[[nodiscard]] absl::StatusOr<base::Json> RunGradUtilsCase(const base::Json& inputs);

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_GRAD_UTILS_CASES_H_
