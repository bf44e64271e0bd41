// Agreement across the ranks of a checkpoint: every exchange carries each rank's status with
// its payload, so a failure on one rank fails every rank with the same error instead of
// leaving its peers waiting in the next collective.
#ifndef KEEL_CHECKPOINT_INTERNAL_AGREEMENT_H_
#define KEEL_CHECKPOINT_INTERNAL_AGREEMENT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::checkpoint::internal {

// Gathers every rank's (status, payload). All OK: every rank's payload, in rank order. Else
// every rank returns the lowest failing rank's status, its message prefixed "rank <r>: " when
// there are several ranks. `group` nullptr is a single process. Collective: over `group`.
// Errors: the failing rank's; kUnavailable when the exchange itself fails.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> Exchange(const absl::Status& status,
                                                                const std::string& payload,
                                                                c10d::ProcessGroup* group,
                                                                absl::string_view what);

// Exchange without payloads: every rank returns the same status.
[[nodiscard]] absl::Status Agree(const absl::Status& status, c10d::ProcessGroup* group,
                                 absl::string_view what);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_AGREEMENT_H_
