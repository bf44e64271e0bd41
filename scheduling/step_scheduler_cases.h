// Runs one step_scheduler golden case (testdata/golden/step_scheduler.json) through Keel, for
// the parity test and //tools:parity: the NeMo recipe loop over a fake loader, with the
// signals and resume phases the case asks for. See testdata/golden/README.md.
#ifndef KEEL_SCHEDULING_STEP_SCHEDULER_CASES_H_
#define KEEL_SCHEDULING_STEP_SCHEDULER_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::scheduling {

// Returns {phases, trace, final} (only {phases: [{derived}]} with run_loop false).
// Errors: kInvalidArgument when Keel refuses the inputs. A case that raises a signal the
// scheduler does not handle is refused rather than run (it would end the process).
[[nodiscard]] absl::StatusOr<base::Json> RunStepSchedulerCase(const base::Json& inputs);

}  // namespace keel::scheduling

#endif  // KEEL_SCHEDULING_STEP_SCHEDULER_CASES_H_
