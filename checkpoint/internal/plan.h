// Deciding which rank writes which block, and whether an object's values are written once or
// per rank. Every rank describes the blocks it holds (a Manifest whose tensors have one chunk
// each, without file placement) and its objects' values; all ranks gather all the descriptions
// and compute the same plan, so no second exchange is needed.
#ifndef KEEL_CHECKPOINT_INTERNAL_PLAN_H_
#define KEEL_CHECKPOINT_INTERNAL_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"

namespace keel::checkpoint::internal {

// For each rank, the names of the tensors whose block it writes. Identical blocks held by
// several ranks (replicated tensors) are written once, by the holder with the fewest bytes
// assigned so far, taking blocks largest first; empty blocks of tensors that are not empty
// are no one's to write. Errors: kInvalidArgument when ranks disagree
// on a tensor's dtype or global shape, hold partly overlapping blocks, or leave part of a
// tensor uncovered.
[[nodiscard]] absl::StatusOr<std::vector<std::vector<std::string>>> PlanWrites(
    const std::vector<Manifest>& local_plans);

// Every object's entry for the manifest, in the local plans' order (by name): its values once
// when every rank's are equal (byte for byte as typed values), else each rank's, in rank order.
// Errors: kInvalidArgument when ranks save different objects, naming one and the ranks.
[[nodiscard]] absl::StatusOr<std::vector<ObjectEntry>> PlanValues(
    const std::vector<Manifest>& local_plans);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_PLAN_H_
