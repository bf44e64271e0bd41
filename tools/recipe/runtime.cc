#include "tools/recipe/runtime.h"

#include <chrono>
#include <string>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "torch/csrc/distributed/c10d/HashStore.hpp"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/cuda.h"

namespace keel::tools::recipe {
namespace {

// Selects LOCAL_RANK's GPU for the NCCL backend.
absl::StatusOr<at::Device> SelectGpu(const parallel::WorkerEnv& env) {
  if (!base::HasNccl()) {
    return absl::InvalidArgumentError(
        "distributed.backend \"nccl\" needs a CUDA build: bazel build --config=cuda with "
        "KEEL_LIBTORCH at a CUDA LibTorch");
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (env.local_rank >= gpus) {
    return absl::FailedPreconditionError(absl::StrCat("distributed.backend \"nccl\": LOCAL_RANK ",
                                                      env.local_rank, " has no GPU (", gpus,
                                                      " visible)"));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kUnavailable, "selecting the GPU",
                                       [&] { base::SetCudaDevice(env.local_rank); }));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

// The store every group rendezvouses through; may throw c10::Error.
c10::intrusive_ptr<c10d::Store> RendezvousStore(const parallel::WorkerEnv& env,
                                                std::chrono::seconds timeout) {
  c10::intrusive_ptr<c10d::Store> store;
  if (env.world_size == 1) {
    store = c10::make_intrusive<c10d::HashStore>();
  } else {
    store = base::CreateTcpStore(env.master_addr, env.master_port,
                                 /*is_server=*/env.rank == 0 && !env.agent_store, env.world_size,
                                 timeout);
  }
  if (env.agent_store) {
    store = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("/worker/attempt_", env.restart_count), store);
  }
  return store;
}

}  // namespace

absl::Status ReduceOverRanks(at::Tensor& tensor, base::Reduce op, const TrainRuntime& runtime,
                             absl::string_view what) {
  if (runtime.control_group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, op, *runtime.control_group, what);
}

absl::Status AgreeOverRanks(const absl::Status& status, const TrainRuntime& runtime,
                            absl::string_view what) {
  return base::AgreeOnStatus(status, runtime.control_group, what);
}

ProcessGroups::ProcessGroups() = default;
ProcessGroups::ProcessGroups(ProcessGroups&&) noexcept = default;
ProcessGroups& ProcessGroups::operator=(ProcessGroups&&) noexcept = default;
ProcessGroups::~ProcessGroups() = default;

absl::StatusOr<ProcessGroups> ProcessGroups::Connect(const parallel::WorkerEnv& env,
                                                     const DistributedOptions& options) {
  ProcessGroups groups;
  const bool nccl = options.backend == Backend::kNccl;
  if (nccl) {
    KEEL_ASSIGN_OR_RETURN(groups.device_, SelectGpu(env));
  }
  if (env.world_size == 1 && !nccl) return groups;
  // NCCL builds its groups for a single process too, on an in-process store.
  const std::chrono::seconds timeout(options.timeout_seconds);
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kUnavailable,
      absl::StrCat("rendezvous at ", env.master_addr, ":", env.master_port), [&] {
        const c10::intrusive_ptr<c10d::Store> store = RendezvousStore(env, timeout);
        auto gloo = [&](const char* name) {
          return base::CreateGlooProcessGroup(c10::make_intrusive<c10d::PrefixStore>(name, store),
                                              env.rank, env.world_size, timeout);
        };
        if (nccl) {
          groups.group_ =
              base::CreateNcclProcessGroup(c10::make_intrusive<c10d::PrefixStore>("default", store),
                                           env.rank, env.world_size, timeout);
          groups.control_group_ = gloo("control");
        } else {
          groups.group_ = gloo("default");
          groups.control_group_ = groups.group_;
        }
        groups.checkpoint_group_ = gloo("checkpoint");
      }));
  return groups;
}

void ProcessGroups::Attach(const parallel::WorkerEnv& env, TrainRuntime& runtime) const {
  runtime.rank = env.rank;
  runtime.world_size = env.world_size;
  runtime.device = device_;
  runtime.group = group_.get();
  runtime.control_group = control_group_.get();
  runtime.checkpoint_group = checkpoint_group_.get();
}

}  // namespace keel::tools::recipe
