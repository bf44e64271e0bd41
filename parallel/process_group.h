// c10d process groups without torch.distributed's global state: the rendezvous store of a torchrun
// launch (torch/distributed/rendezvous.py's env:// handler), Gloo and NCCL groups over a store
// (what new_group builds), and the device a backend computes on. DeviceMesh builds every group of a
// layout from these.
//
//   KEEL_ASSIGN_OR_RETURN(keel::parallel::WorkerEnv env, keel::parallel::ReadWorkerEnv());
//   const std::chrono::seconds timeout(60);
//   KEEL_ASSIGN_OR_RETURN(auto store, keel::parallel::ConnectStore(env, timeout));
//   KEEL_ASSIGN_OR_RETURN(auto group, keel::parallel::CreateProcessGroup(
//       keel::parallel::Backend::kGloo, store, env.rank, env.world_size, timeout));
#ifndef KEEL_PARALLEL_PROCESS_GROUP_H_
#define KEEL_PARALLEL_PROCESS_GROUP_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/Device.h"
#include "c10/util/intrusive_ptr.h"
#include "parallel/torchrun_env.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace keel::parallel {

// The c10d backend for device tensors: Gloo on the CPU, NCCL on GPUs (a --config=cuda build
// against a CUDA LibTorch). Spelled "gloo" and "nccl".
enum class Backend { kGloo, kNccl };

// Parse an exact spelling (false and an error listing the spellings otherwise) or give it back.
// These are Abseil's flag hooks, so Backend also works as an absl flag and a JSON field.
bool AbslParseFlag(absl::string_view text, Backend* out, std::string* error);
std::string AbslUnparseFlag(Backend backend);

// The store every group of a launch rendezvouses through: an in-process store for a world of
// one; otherwise a TCPStore at env.master_addr:env.master_port that rank 0 serves, or, with
// env.agent_store, torchrun's agent serves and each rank sees under the prefix
// /worker/attempt_<restart_count>. Waits up to `timeout` for all env.world_size ranks.
// Errors: kUnavailable naming the address when the store cannot be served or reached in time.
[[nodiscard]] absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(
    const WorkerEnv& env, std::chrono::milliseconds timeout);

// A group of `size` ranks, this process being `rank`, rendezvousing through `store` (give each
// group its own store prefix). Collective operations time out after `timeout`.
// Collective: blocks until all `size` ranks have called it with the same store.
// Errors: kInvalidArgument for a rank outside [0, size), no store, or kNccl without a CUDA
// build with NCCL; kUnavailable when the rendezvous fails or times out.
[[nodiscard]] absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    Backend backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// Where a rank of `backend` computes: the CPU for kGloo; for kNccl GPU `local_rank`, which
// becomes this thread's current CUDA device (call it before creating NCCL groups).
// Errors: kInvalidArgument for kNccl without a CUDA build; kFailedPrecondition when GPU
// `local_rank` does not exist; kUnavailable when CUDA refuses the device.
[[nodiscard]] absl::StatusOr<c10::Device> SelectDevice(Backend backend, int local_rank);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_PROCESS_GROUP_H_
