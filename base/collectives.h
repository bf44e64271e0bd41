// Blocking c10d collectives that report failure as a Status, for Keel's few small reductions
// (norm scalars, agreement flags).
//
//   at::Tensor flag = at::ones({1}, at::kInt);
//   KEEL_RETURN_IF_ERROR(keel::base::AllReduce(flag, keel::base::Reduce::kMax, group, "stop
//   flag"));
#ifndef KEEL_BASE_COLLECTIVES_H_
#define KEEL_BASE_COLLECTIVES_H_

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::base {

enum class Reduce { kSum, kMax };

// All-reduces `tensor` in place over `group` and waits for it. Errors: kUnavailable, "all-reducing
// <context>: <what c10d said>", when a peer or the backend fails.
// Requires: every rank of `group` calls it with a tensor of the same shape and dtype.
[[nodiscard]] absl::Status AllReduce(at::Tensor& tensor, Reduce op, c10d::ProcessGroup& group,
                                     absl::string_view context);

}  // namespace keel::base

#endif  // KEEL_BASE_COLLECTIVES_H_
