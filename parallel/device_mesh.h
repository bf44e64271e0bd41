// One rank's process groups of Megatron-Core's layout (MeshLayout), over c10d: what
// initialize_model_parallel creates and parallel_state's getters return
// (megatron/core/parallel_state.py), as accessors by GroupKind on an object passed explicitly
// instead of module globals. Device tensors go over the backend's groups (NCCL on GPUs, Gloo on
// the CPU); host scalars over Gloo twins of them; beside these, one world-wide Gloo group for
// control scalars and one for checkpoint exchanges.
//
//   keel::parallel::ModelParallelOptions options;
//   options.tensor_model_parallel_size = 2;
//   KEEL_ASSIGN_OR_RETURN(keel::parallel::DeviceMesh mesh,
//                         keel::parallel::DeviceMesh::Connect(env, options, Backend::kGloo,
//                                                             std::chrono::seconds(60)));
//   c10d::ProcessGroup* tp = mesh.Group(keel::parallel::GroupKind::kTp);  // null on 1 Gloo rank
//   const int dp_rank = mesh.GroupRank(keel::parallel::GroupKind::kDp);
#ifndef KEEL_PARALLEL_DEVICE_MESH_H_
#define KEEL_PARALLEL_DEVICE_MESH_H_

#include <array>
#include <chrono>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "c10/util/intrusive_ptr.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"
#include "parallel/torchrun_env.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace keel::parallel {

// The groups of every kind that contain this rank. Kinds whose groups have the same members
// share one c10d group (in a dense-only layout dp, dp-cp, tp-dp, tp-dp-cp and expert_dp are
// one group, and every kind of size one is another).
//
// World size 1 on Gloo creates no c10d group at all: every group accessor returns nullptr,
// which Keel's components take as "one rank, nothing to exchange", while ranks and sizes still
// answer (0 and 1). Otherwise every group accessor of a kind holding this rank is non-null,
// a group of one included, as Megatron's are; kEmbedding and kPositionEmbedding may not hold
// this rank (nullptr, GroupRank and GroupSize -1, as torch.distributed.get_rank(group) gives
// outside a group).
class DeviceMesh {
 public:
  // Creates, through `store`, the groups of `layout` that contain `rank`, then the control
  // and checkpoint groups. Collective: every rank of layout.world_size() calls it with the same
  // layout, backend and store; it returns once the groups are formed. Errors: kInvalidArgument
  // for a rank outside the world or those of CreateProcessGroup; kUnavailable when a
  // rendezvous fails or times out (after `timeout`, which also bounds every later collective).
  // Requires: for kNccl, SelectDevice already made this rank's GPU current.
  [[nodiscard]] static absl::StatusOr<DeviceMesh> Create(
      MeshLayout layout, int rank, const c10::intrusive_ptr<c10d::Store>& store, Backend backend,
      std::chrono::milliseconds timeout);

  // Makes a group for device tensors of `size` ranks, this one `rank`, rendezvousing through
  // `store`, as CreateProcessGroup does for a Backend.
  using GroupFactory = std::function<absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>>(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      std::chrono::milliseconds timeout)>;

  // As Create, with the device groups that `make_device_group` makes (a backend of one's own,
  // or a test's stand-in for NCCL), each with a Gloo twin for host tensors as NCCL's have, also
  // on one rank. Errors: as Create, and those of `make_device_group`.
  [[nodiscard]] static absl::StatusOr<DeviceMesh> CreateWithDeviceGroups(
      MeshLayout layout, int rank, const c10::intrusive_ptr<c10d::Store>& store,
      GroupFactory make_device_group, std::chrono::milliseconds timeout);

  // The mesh of a torchrun worker: the layout of `options` over env.world_size, the store of
  // ConnectStore(env), then Create. Errors: those of MeshLayout::Create, ConnectStore and
  // Create. Requires: as Create.
  [[nodiscard]] static absl::StatusOr<DeviceMesh> Connect(const WorkerEnv& env,
                                                          const ModelParallelOptions& options,
                                                          Backend backend,
                                                          std::chrono::milliseconds timeout);

  DeviceMesh(DeviceMesh&&) noexcept;
  DeviceMesh& operator=(DeviceMesh&&) noexcept;
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;
  ~DeviceMesh();

  const MeshLayout& layout() const { return layout_; }
  // This process's global rank, and the number of ranks.
  int rank() const { return rank_; }
  int world_size() const { return layout_.world_size(); }

  // The group of `kind` holding this rank, for tensors on the backend's device (Megatron's
  // get_tensor_model_parallel_group() and the like); see the class comment for nullptr.
  c10d::ProcessGroup* Group(GroupKind kind) const;
  // A Gloo group with the same members, for host tensors (Group itself on Gloo).
  c10d::ProcessGroup* GlooGroup(GroupKind kind) const;
  // This rank's index in its group of `kind` (its coordinate), or -1 outside every group.
  int GroupRank(GroupKind kind) const;
  // The number of ranks in that group, or -1 outside every group.
  int GroupSize(GroupKind kind) const;
  // The global ranks of that group in ascending order; empty outside every group.
  const std::vector<int>& GroupRanks(GroupKind kind) const;

  // A Gloo group of all ranks for host scalars (token counts, losses, agreement on errors):
  // the Gloo group of a kind that spans the world when there is one, as today's data-parallel
  // Gloo runs share it with the gradient all-reduce. nullptr as the class comment says.
  c10d::ProcessGroup* control_group() const { return control_.get(); }
  // A Gloo group of all ranks that nothing else uses, for checkpoint exchanges, which an async
  // save runs on a background thread. nullptr as the class comment says.
  c10d::ProcessGroup* checkpoint_group() const { return checkpoint_.get(); }
  // The store the groups were formed through, under a prefix of the mesh's own: for waits no
  // collective's timeout should bound (a phase only one rank runs). nullptr as the class
  // comment says.
  c10d::Store* store() const { return store_.get(); }

 private:
  // `make_device_group` nullptr: the device groups are Gloo groups (their own twins).
  DeviceMesh(MeshLayout layout, int rank, GroupFactory make_device_group);

  // Creates this rank's groups of every kind, in one global order.
  [[nodiscard]] absl::Status CreateKindGroups(const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout);

  MeshLayout layout_;
  int rank_;
  GroupFactory make_device_group_;
  std::array<c10::intrusive_ptr<c10d::ProcessGroup>, kNumGroupKinds> groups_;
  std::array<c10::intrusive_ptr<c10d::ProcessGroup>, kNumGroupKinds> gloo_groups_;
  c10::intrusive_ptr<c10d::ProcessGroup> control_;
  c10::intrusive_ptr<c10d::ProcessGroup> checkpoint_;
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_DEVICE_MESH_H_
