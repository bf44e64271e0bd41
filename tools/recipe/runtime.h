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
#include "models/language_model.h"
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
  // The mesh the groups come from (its layout, every kind's group, the store); nullptr for a
  // single process (tests, the dry run), where every group below is nullptr.
  const parallel::DeviceMesh* mesh = nullptr;
  // Where the model trains: the CPU, or this rank's GPU with the NCCL backend.
  at::Device device = at::kCPU;
  // The ranks on this machine, this one among them (torchrun's LOCAL_WORLD_SIZE): they share
  // its memory.
  int local_world_size = 1;
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

  // The mesh's groups by what the trainer does with them (not owned). On `device` (NCCL on
  // GPUs): the gradients' average over data x context parallelism (nullptr for one such
  // rank: on a GPU its buckets, kernels and failure check would cost every step); the model's
  // tensor-, expert- and expert tensor-parallel layers, and the expert data-parallel average;
  // the pipeline's activations and the tied embedding of its first and last stage (nullptr
  // for one stage).
  c10d::ProcessGroup* gradient_group() const;
  c10d::ProcessGroup* tensor_group() const;
  c10d::ProcessGroup* expert_group() const;
  c10d::ProcessGroup* expert_tensor_group() const;
  c10d::ProcessGroup* expert_data_group() const;
  c10d::ProcessGroup* pipeline_group() const;
  c10d::ProcessGroup* embedding_group() const;
  // The model's: tensor_group, pipeline_group, expert_group and expert_tensor_group, and
  // `options`' sequence_parallel.
  models::ModelGroups model_groups(const DistributedOptions& options) const;
  // Gloo twins, for host values: all ranks (the preemption flag, agreement on errors); the
  // data-parallel ranks (sums over the data: label tokens, losses); the pipeline's stages
  // (what the last stage computes; nullptr for one stage); all ranks again for checkpoint
  // exchanges (async saves run them on a thread of their own).
  c10d::ProcessGroup* control_group() const;
  c10d::ProcessGroup* data_host_group() const;
  c10d::ProcessGroup* pipeline_host_group() const;
  c10d::ProcessGroup* checkpoint_group() const;
  // The rendezvous store of the mesh (RunOnRankZero's waits, the hang watchdog).
  c10d::Store* store() const;
};

// Reduces `tensor` in place over the control group (nothing for a single process).
// Collective: over runtime.control_group(). Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status ReduceOverRanks(at::Tensor& tensor, base::Reduce op,
                                           const TrainRuntime& runtime, absl::string_view what);

// Sums `tensor` in place over the data-parallel ranks (nothing for a single process): each
// batch counted once, however many tensor-parallel ranks compute it.
// Collective: over runtime.data_host_group(). Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status SumOverData(at::Tensor& tensor, const TrainRuntime& runtime,
                                       absl::string_view what);

// Sums `tensor` in place over the stages of this rank's pipeline (nothing for a single
// process): what only the last stage computes reaches every stage.
// Collective: over runtime.pipeline_host_group(). Errors: kUnavailable naming `what`.
[[nodiscard]] absl::Status SumOverStages(at::Tensor& tensor, const TrainRuntime& runtime,
                                         absl::string_view what);

// Every rank learns whether any rank failed: all ranks return the lowest failing rank's status
// ("rank <r>: ..."), or OK (base::AgreeOnStatus). Collective: over runtime.control_group().
[[nodiscard]] absl::Status AgreeOverRanks(const absl::Status& status, const TrainRuntime& runtime,
                                          absl::string_view what);

// How RunOnRankZero's waiting ranks wait.
struct RankZeroWait {
  // A line "waiting for rank 0: <what> (<s> s)" on rank 1's log this often.
  std::chrono::milliseconds progress_every = std::chrono::minutes(1);
  // The longest wait, after which the waiting ranks give up (kDeadlineExceeded).
  std::chrono::milliseconds limit = std::chrono::hours(24);
  // The polls back off from 100 ms to this: the waiting ranks reach the collective after the
  // phase up to this late, so it must stay well under the collectives' timeout (a quarter of
  // it, say).
  std::chrono::milliseconds longest_poll = std::chrono::seconds(1);
};

// The trainer's waits: polls that back off to a quarter of distributed.timeout_seconds at most
// (1 s by default), the other fields' defaults.
RankZeroWait RankZeroWaitFor(const TrainOptions& options);

// A phase only rank 0 runs (preparing the default corpus, checking the datasets, building the
// index caches), which may take far longer than distributed.timeout_seconds: rank 0 runs
// `phase` and publishes its status in the store; the other ranks wait for it there, outside
// any collective (polling; a progress line, as `wait` says). Every rank returns rank 0's
// status (prefixed "rank 0: " on the others). A single process runs `phase`. Collective: every
// rank calls it with the same `what`, once per launch. Errors: rank 0's; kUnavailable when the
// store fails (rank 0 gone); kDeadlineExceeded after wait.limit.
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
  // GPU first. While the ranks gather (up to distributed.timeout_seconds), the first rank of
  // each node (LOCAL_RANK 0) writes "rendezvous at <addr>:<port>: waiting for the <n> ranks
  // (<s> s of distributed.timeout_seconds <t>)" to `log` every `progress_every`, so that a
  // rank that never comes is no silent wait. Errors: kInvalidArgument for NCCL without a
  // CUDA build; kFailedPrecondition for a LOCAL_RANK without a GPU; kUnavailable when the
  // rendezvous fails or times out.
  [[nodiscard]] static absl::StatusOr<ProcessGroups> Connect(
      const parallel::WorkerEnv& env, const DistributedOptions& options,
      std::ostream* log = nullptr,
      std::chrono::milliseconds progress_every = std::chrono::minutes(1));

  // Fills rank, world size, coordinates, device and the mesh of `runtime` (AttachMesh).
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

// Fills rank, world size, coordinates, device and the mesh of `runtime` from `mesh`, whose
// device groups carry tensors on `device`. Requires: `mesh` outlives `runtime`.
void AttachMesh(const parallel::DeviceMesh& mesh, const at::Device& device, TrainRuntime& runtime);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_RUNTIME_H_
