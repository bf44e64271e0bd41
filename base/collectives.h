// Blocking c10d collectives that report failure as a Status, for Keel's few small exchanges
// (norm scalars, agreement flags, checkpoint plans); agreement: every rank returns the same
// status when any rank failed; and the check that a group carries a tensor's device.
//
//   at::Tensor flag = at::ones({1}, at::kInt);
//   KEEL_RETURN_IF_ERROR(AllReduce(flag, Reduce::kMax, group, "the stop flag"));
#ifndef KEEL_BASE_COLLECTIVES_H_
#define KEEL_BASE_COLLECTIVES_H_

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::base {

enum class Reduce { kSum, kMax, kMin };

// The number of ranks in `group`, and this process's rank in it: nullptr is a group of one
// (Keel's "no group": a single process, or a dimension of size 1), where it is rank 0.
int GroupSize(const c10d::ProcessGroup* group);
int GroupRank(const c10d::ProcessGroup* group);

// All-reduces `tensor` in place over `group` and waits for it. Collective: over `group`.
// Errors: kUnavailable, "all-reducing <context>: <what c10d said>", when a peer or the backend
// fails; kInvalidArgument when `group` does not carry the tensor's device (CheckGroupCarries).
// Requires: every rank of `group` calls it with a tensor of the same shape and dtype.
[[nodiscard]] absl::Status AllReduce(at::Tensor& tensor, Reduce op, c10d::ProcessGroup& group,
                                     absl::string_view context);

// Gathers every rank's `bytes` (any length) on every rank, in rank order, through host tensors.
// Collective: over `group`. Errors: kUnavailable, "all-gathering <context>: ...", when a peer
// or the backend fails; kInvalidArgument for a device group (CheckGroupCarries).
// Requires: every rank of `group` calls it.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> AllGatherBytes(const std::string& bytes,
                                                                      c10d::ProcessGroup& group,
                                                                      absl::string_view context);

// Every rank's (status, payload), gathered on every rank: all OK gives every rank's payload in
// rank order; otherwise every rank returns the lowest failing rank's status, its message
// prefixed "rank <r>: " when there are several ranks, so ranks fail together instead of one
// waiting for the others in its next collective. `group` nullptr is a single process.
// Collective: over `group`. Errors: the failing rank's; kUnavailable when the exchange fails.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ExchangeWithStatus(
    const absl::Status& status, const std::string& payload, c10d::ProcessGroup* group,
    absl::string_view context);

// A status as bytes (one byte of code, then the message) and back, for a status that travels
// outside a collective (through a store); bytes that are not one read as kInternal.
std::string StatusBytes(const absl::Status& status);
absl::Status StatusFromBytes(absl::string_view bytes);

// ExchangeWithStatus without payloads: every rank returns the same status.
// Collective: over `group`.
[[nodiscard]] absl::Status AgreeOnStatus(const absl::Status& status, c10d::ProcessGroup* group,
                                         absl::string_view context);

// Every rank learns whether any rank failed, with one all-reduce (MIN) of one integer on
// `device`, so it works over a group of any backend (NCCL: the rank's GPU) and costs one small
// collective when all succeed: a failing rank returns its own status; the others return
// kAborted, "rank <r> failed <context>; see its error", naming the lowest failing rank. For the
// paths that must stay paired whatever happens locally (a step that throws on one rank).
// Collective: over `group`. Errors: as described; kUnavailable when the all-reduce fails.
[[nodiscard]] absl::Status AgreeOnFailure(const absl::Status& status, c10d::ProcessGroup& group,
                                          const at::Device& device, absl::string_view context);

// OK when `group` carries tensors on `device`: a device group (backend "nccl") carries no
// host (CPU) tensor, and a host group (backend "gloo", which Keel registers for CPU tensors
// only) no device tensor; nullptr (a single process) carries any. Keel checks the exchanges
// it launches with it, so that a tensor on the wrong side of a group fails naming the exchange
// (`what`) instead of inside c10d ("No backend type associated with device type cpu").
// Errors: kInvalidArgument naming `what`, the device and the backend, and what to do.
[[nodiscard]] absl::Status CheckGroupCarries(const c10d::ProcessGroup* group,
                                             const at::Device& device, absl::string_view what);

// CheckGroupCarries for code whose errors are exceptions (autograd functions' passes): throws
// c10::Error with its message.
void CheckGroupCarriesOrThrow(const c10d::ProcessGroup* group, const at::Device& device,
                              absl::string_view what);

}  // namespace keel::base

#endif  // KEEL_BASE_COLLECTIVES_H_
