// Where a training run happens: this process's rank, its device, and the c10d process groups
// of a parallel::DeviceMesh built from torchrun's environment (a TCPStore rendezvous and Gloo,
// or NCCL for gradients).
//
//   KEEL_ASSIGN_OR_RETURN(ProcessGroups groups, ProcessGroups::Connect(env, options));
//   TrainRuntime runtime;
//   groups.Attach(runtime);
#ifndef KEEL_TOOLS_RECIPE_RUNTIME_H_
#define KEEL_TOOLS_RECIPE_RUNTIME_H_

#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/collectives.h"
#include "c10/core/Device.h"
#include "parallel/device_mesh.h"
#include "parallel/torchrun_env.h"
#include "scheduling/preemption.h"
#include "tools/recipe/options.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace keel::tools::recipe {

// This process's place in the run. The groups are not owned (ProcessGroups owns them).
struct TrainRuntime {
  int rank = 0;
  int world_size = 1;
  // This rank's coordinate along the data-parallel dimension of the mesh, and its size: what
  // the sampler slices the data by and the gradients are averaged over.
  int dp_rank = 0;
  int dp_size = 1;
  // The mesh the groups come from (its layout, every kind's group); nullptr for a runtime that
  // was not connected (a single process in tests, the dry run).
  const parallel::DeviceMesh* mesh = nullptr;
  // Where the model trains: the CPU, or this rank's GPU with the NCCL backend.
  at::Device device = at::kCPU;
  // The data-parallel group for tensors on `device` (gradient sync); nullptr for one
  // data-parallel rank.
  c10d::ProcessGroup* group = nullptr;
  // The tensor-parallel group for tensors on `device` (the model's layers); nullptr for a
  // single process.
  c10d::ProcessGroup* tp_group = nullptr;
  // The pipeline stages of this rank's pipeline, for activations and their gradients on
  // `device`; nullptr for one stage.
  c10d::ProcessGroup* pp_group = nullptr;
  // A CPU (Gloo) group of the same stages, for the losses the last stage computes; nullptr for
  // one stage.
  c10d::ProcessGroup* pipeline_group = nullptr;
  // The first and last stage of this rank's pipeline (Megatron's embedding group), which both
  // hold the tied word embedding, on `device`; nullptr on the other stages and for one stage.
  c10d::ProcessGroup* embedding_group = nullptr;
  // The expert-parallel group (the ranks that split the experts) and the expert data-parallel
  // group (the ranks holding the same experts) on `device`; nullptr for a single process.
  c10d::ProcessGroup* ep_group = nullptr;
  c10d::ProcessGroup* expert_data_group = nullptr;
  // The ranks one expert's weights are split across (Megatron's expert tensor-parallel group).
  c10d::ProcessGroup* expert_tp_group = nullptr;
  // A CPU (Gloo) group of all ranks for host scalars: the preemption flag, agreement on
  // errors. nullptr for a single process.
  c10d::ProcessGroup* control_group = nullptr;
  // A CPU (Gloo) group of the data-parallel ranks, for sums over the data (label tokens,
  // losses), which every tensor-parallel rank computes alike. nullptr for a single process.
  c10d::ProcessGroup* data_group = nullptr;
  // A third group over the same ranks for checkpoint exchanges (async saves run them on a
  // background thread); nullptr for a single process.
  c10d::ProcessGroup* checkpoint_group = nullptr;
  // The rendezvous store of the mesh, for RunOnRankZero's waits; nullptr for a single process
  // (and for a runtime a test assembles from groups alone: RunOnRankZero agrees over the
  // control group then).
  c10d::Store* store = nullptr;
  // Progress lines and notices (rank 0 writes them).
  std::ostream* log = nullptr;
  // How many times the launcher restarted the workers before this start
  // (parallel::WorkerEnv::restart_count) and why (restart_cause; empty when it did not say):
  // the first step's metrics record them.
  int restart_count = 0;
  std::string restart_cause;
  // This rank's preemption flag; nullptr installs handlers for
  // step_scheduler.preemption_signal.
  std::unique_ptr<scheduling::PreemptionFlag> preemption;
};

// Reduces `tensor` in place over the control group (nothing for a single process).
// Collective: over runtime.control_group. Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status ReduceOverRanks(at::Tensor& tensor, base::Reduce op,
                                           const TrainRuntime& runtime, absl::string_view what);

// Sums `tensor` in place over the data-parallel ranks (nothing for a single process): each
// batch counted once, however many tensor-parallel ranks compute it.
// Collective: over runtime.data_group. Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status SumOverData(at::Tensor& tensor, const TrainRuntime& runtime,
                                       absl::string_view what);

// Sums `tensor` in place over the stages of this rank's pipeline (nothing for a single
// process): what only the last stage computes reaches every stage.
// Collective: over runtime.pipeline_group. Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status SumOverStages(at::Tensor& tensor, const TrainRuntime& runtime,
                                         absl::string_view what);

// Every rank learns whether any rank failed: all ranks return the lowest failing rank's status
// ("rank <r>: ..."), or OK (base::AgreeOnStatus). Collective: over runtime.control_group.
[[nodiscard]] absl::Status AgreeOverRanks(const absl::Status& status, const TrainRuntime& runtime,
                                          absl::string_view what);

// How RunOnRankZero's waiting ranks wait.
struct RankZeroWait {
  // A line "waiting for rank 0: <what> (<s> s)" on rank 1's log this often.
  std::chrono::milliseconds progress_every = std::chrono::minutes(1);
  // The longest wait, after which the waiting ranks give up (kDeadlineExceeded).
  std::chrono::milliseconds limit = std::chrono::hours(24);
};

// A phase only rank 0 runs (preparing the default corpus, checking the datasets, building the
// index caches), which may take far longer than distributed.timeout_seconds: rank 0 runs
// `phase` and publishes its status in the store; the other ranks wait for it there, outside
// any collective (polling; a progress line, as `wait` says). Every rank returns rank 0's
// status (prefixed "rank 0: " on the others). Without a store, the ranks agree over the
// control group instead, bounded by its timeout. Collective: every rank calls it with the same
// `what`, once per launch. Errors: rank 0's; kUnavailable when the store fails (rank 0 gone);
// kDeadlineExceeded after wait.limit.
[[nodiscard]] absl::Status RunOnRankZero(const TrainRuntime& runtime, absl::string_view what,
                                         const std::function<absl::Status()>& phase,
                                         const RankZeroWait& wait = {});

// The process groups of one rank, built from torchrun's environment: gradients over NCCL or
// Gloo, host scalars and checkpoint exchanges over Gloo: a DeviceMesh of
// distributed.tensor_model_parallel_size, pipeline_model_parallel_size and the data-parallel
// ranks left.
class ProcessGroups {
 public:
  // Rendezvous through the TCPStore `env` names (torchrun's agent store, or one rank 0 serves)
  // and builds the mesh; a single Gloo process builds no group. For NCCL, selects LOCAL_RANK's
  // GPU first. Errors: kInvalidArgument for NCCL without a CUDA build; kFailedPrecondition for
  // a LOCAL_RANK without a GPU; kUnavailable when the rendezvous fails or times out.
  [[nodiscard]] static absl::StatusOr<ProcessGroups> Connect(const parallel::WorkerEnv& env,
                                                             const DistributedOptions& options);

  // Fills rank, world size, coordinates, device and the groups of `runtime` (AttachMesh).
  // Requires: these groups outlive `runtime`.
  void Attach(TrainRuntime& runtime) const;

  ProcessGroups(ProcessGroups&&) noexcept;
  ProcessGroups& operator=(ProcessGroups&&) noexcept;
  ~ProcessGroups();

 private:
  ProcessGroups(parallel::DeviceMesh mesh, at::Device device);

  parallel::DeviceMesh mesh_;
  at::Device device_;
};

// Fills rank, world size, coordinates, device and the groups of `runtime` from `mesh`, whose
// device groups carry tensors on `device`. Requires: `mesh` outlives `runtime`.
void AttachMesh(const parallel::DeviceMesh& mesh, const at::Device& device, TrainRuntime& runtime);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_RUNTIME_H_
