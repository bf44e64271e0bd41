#include "tools/recipe/runtime.h"

#include <chrono>
#include <utility>

#include "base/status.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"

namespace keel::tools::recipe {

absl::Status ReduceOverRanks(at::Tensor& tensor, base::Reduce op, const TrainRuntime& runtime,
                             absl::string_view what) {
  if (runtime.control_group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, op, *runtime.control_group, what);
}

absl::Status SumOverData(at::Tensor& tensor, const TrainRuntime& runtime, absl::string_view what) {
  if (runtime.data_group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, base::Reduce::kSum, *runtime.data_group, what);
}

absl::Status SumOverStages(at::Tensor& tensor, const TrainRuntime& runtime,
                           absl::string_view what) {
  if (runtime.pipeline_group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, base::Reduce::kSum, *runtime.pipeline_group, what);
}

absl::Status AgreeOverRanks(const absl::Status& status, const TrainRuntime& runtime,
                            absl::string_view what) {
  return base::AgreeOnStatus(status, runtime.control_group, what);
}

ProcessGroups::ProcessGroups(parallel::DeviceMesh mesh, at::Device device)
    : mesh_(std::move(mesh)), device_(device) {}
ProcessGroups::ProcessGroups(ProcessGroups&&) noexcept = default;
ProcessGroups& ProcessGroups::operator=(ProcessGroups&&) noexcept = default;
ProcessGroups::~ProcessGroups() = default;

absl::StatusOr<ProcessGroups> ProcessGroups::Connect(const parallel::WorkerEnv& env,
                                                     const DistributedOptions& options) {
  const absl::StatusOr<at::Device> device = parallel::SelectDevice(options.backend, env.local_rank);
  KEEL_RETURN_IF_ERROR(base::Annotate(device.status(), "distributed"));
  KEEL_ASSIGN_OR_RETURN(
      parallel::DeviceMesh mesh,
      parallel::DeviceMesh::Connect(env, options.parallel, options.backend,
                                    std::chrono::seconds(options.timeout_seconds)));
  return ProcessGroups(std::move(mesh), *device);
}

void ProcessGroups::Attach(TrainRuntime& runtime) const { AttachMesh(mesh_, device_, runtime); }

void AttachMesh(const parallel::DeviceMesh& mesh, const at::Device& device, TrainRuntime& runtime) {
  runtime.rank = mesh.rank();
  runtime.world_size = mesh.world_size();
  runtime.dp_rank = mesh.GroupRank(parallel::GroupKind::kDp);
  runtime.dp_size = mesh.GroupSize(parallel::GroupKind::kDp);
  runtime.mesh = &mesh;
  runtime.device = device;
  // Megatron's DDP reduces dense gradients over dp with cp (get_data_parallel_group(
  // with_context_parallel=True)); over one rank there is nothing to reduce (and on a GPU the
  // reduction's buckets, kernels and failure check would cost every step).
  runtime.group = mesh.GroupSize(parallel::GroupKind::kDpCp) > 1
                      ? mesh.Group(parallel::GroupKind::kDpCp)
                      : nullptr;
  runtime.tp_group = mesh.Group(parallel::GroupKind::kTp);
  runtime.ep_group = mesh.Group(parallel::GroupKind::kEp);
  runtime.expert_tp_group = mesh.Group(parallel::GroupKind::kExpertTp);
  runtime.expert_data_group = mesh.Group(parallel::GroupKind::kExpertDp);
  if (mesh.GroupSize(parallel::GroupKind::kPp) > 1) {
    runtime.pp_group = mesh.Group(parallel::GroupKind::kPp);
    runtime.pipeline_group = mesh.GlooGroup(parallel::GroupKind::kPp);
    runtime.embedding_group = mesh.Group(parallel::GroupKind::kEmbedding);
  }
  runtime.control_group = mesh.control_group();
  runtime.data_group = mesh.GlooGroup(parallel::GroupKind::kDp);
  runtime.checkpoint_group = mesh.checkpoint_group();
}

}  // namespace keel::tools::recipe
