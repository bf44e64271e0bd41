#include "parallel/process_group.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/cuda.h"

namespace keel::parallel {
namespace {

constexpr base::EnumSpelling<Backend> kBackends[] = {
    {Backend::kGloo, "gloo"},
    {Backend::kNccl, "nccl"},
};

absl::Status RequireNccl() {
  if (base::HasNccl()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "backend \"nccl\" needs a CUDA build: bazel build --config=cuda with KEEL_LIBTORCH at a "
      "CUDA LibTorch");
}

}  // namespace

bool AbslParseFlag(absl::string_view text, Backend* out, std::string* error) {
  return base::ParseEnum(kBackends, text, out, error);
}

std::string AbslUnparseFlag(Backend backend) {
  return std::string(base::EnumName(kBackends, backend));
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const WorkerEnv& env,
                                                             std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kUnavailable,
      absl::StrCat("rendezvous at ", env.master_addr, ":", env.master_port), [&] {
        if (env.world_size == 1) {
          store = c10::make_intrusive<c10d::HashStore>();
        } else {
          store = base::CreateTcpStore(env.master_addr, env.master_port,
                                       /*is_server=*/env.rank == 0 && !env.agent_store,
                                       env.world_size, timeout);
        }
      }));
  if (env.agent_store) {
    store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("/worker/attempt_", env.restart_count), store);
  }
  return store;
}

absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> CreateProcessGroup(
    Backend backend, const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("process group rank ", rank, " is outside [0, ", size, ")"));
  }
  if (!store) return absl::InvalidArgumentError("a process group needs a rendezvous store");
  if (backend == Backend::kNccl) KEEL_RETURN_IF_ERROR(RequireNccl());
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kUnavailable,
      absl::StrCat(AbslUnparseFlag(backend), " rendezvous of rank ", rank, " of ", size), [&] {
        group = backend == Backend::kNccl
                    ? base::CreateNcclProcessGroup(store, rank, size, timeout)
                    : base::CreateGlooProcessGroup(store, rank, size, timeout);
      }));
  return group;
}

absl::StatusOr<c10::Device> SelectDevice(Backend backend, int local_rank) {
  if (backend == Backend::kGloo) return c10::Device(c10::kCPU);
  KEEL_RETURN_IF_ERROR(RequireNccl());
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (local_rank < 0 || local_rank >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat("backend \"nccl\": LOCAL_RANK ", local_rank,
                                                      " has no GPU (", gpus, " visible)"));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kUnavailable, "selecting the GPU",
                                       [&] { base::SetCudaDevice(local_rank); }));
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace keel::parallel
