// Runs one param_scheduler golden case (testdata/golden/param_scheduler.json) through Keel,
// for the parity test and //tools:parity. The inputs and the result have the golden
// file's shape; see testdata/golden/README.md.
#ifndef KEEL_OPTIM_PARAM_SCHEDULER_CASES_H_
#define KEEL_OPTIM_PARAM_SCHEDULER_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::optim {

// Builds the scheduler from `inputs` (constructor arguments, param_groups, ops) over an
// optimizer with one parameter per group, applies the ops and returns {after_init, trace}.
// Errors: kInvalidArgument when Keel refuses the inputs or an op.
[[nodiscard]] absl::StatusOr<base::Json> RunParamSchedulerCase(const base::Json& inputs);

}  // namespace keel::optim

#endif  // KEEL_OPTIM_PARAM_SCHEDULER_CASES_H_
