// How the groups come to be. A c10d group forms by a rendezvous of its members alone (each
// writes its address under the group's store prefix, then waits for the others'), so a rank
// creates only the groups that contain it, each under a prefix unique to its kind and index in
// Groups(kind) ("mesh/<kind>/<index>", "/gloo" after it for an NCCL group's Gloo twin).
//
// Creation blocks until every member has arrived, so all ranks create their groups in one
// global order: kinds in kGroupKinds order, then the control and checkpoint groups. If rank A
// created group X before Y while rank B, a member of both, created Y before X, A would wait in
// X for B, and B in Y for A, until both time out. With one order, of any two groups two ranks
// share, both create the same one first.
//
// A kind whose group has the members of a group this rank already created reuses it instead.
// Every member decides alike: the earlier kind partitions the world too, so each member's group
// of it is that same set.
#include "parallel/device_mesh.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

size_t Index(GroupKind kind) { return static_cast<size_t>(kind); }

const std::vector<int>& NoRanks() {
  static const auto* const kNone = new std::vector<int>();
  return *kNone;
}

}  // namespace

DeviceMesh::DeviceMesh(MeshLayout layout, int rank, GroupFactory make_device_group)
    : layout_(std::move(layout)), rank_(rank), make_device_group_(std::move(make_device_group)) {}
DeviceMesh::DeviceMesh(DeviceMesh&&) noexcept = default;
DeviceMesh& DeviceMesh::operator=(DeviceMesh&&) noexcept = default;
DeviceMesh::~DeviceMesh() = default;

absl::StatusOr<DeviceMesh> DeviceMesh::Create(MeshLayout layout, int rank,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              Backend backend, std::chrono::milliseconds timeout) {
  if (backend == Backend::kGloo) {
    const int world_size = layout.world_size();
    if (world_size == 1 && rank == 0) return DeviceMesh(std::move(layout), rank, nullptr);
    return CreateWithDeviceGroups(std::move(layout), rank, store, nullptr, timeout);
  }
  return CreateWithDeviceGroups(
      std::move(layout), rank, store,
      [backend](const c10::intrusive_ptr<c10d::Store>& group_store, int group_rank, int size,
                std::chrono::milliseconds group_timeout) {
        return CreateProcessGroup(backend, group_store, group_rank, size, group_timeout);
      },
      timeout);
}

absl::StatusOr<DeviceMesh> DeviceMesh::CreateWithDeviceGroups(
    MeshLayout layout, int rank, const c10::intrusive_ptr<c10d::Store>& store,
    GroupFactory make_device_group, std::chrono::milliseconds timeout) {
  const int world_size = layout.world_size();
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the world of ", world_size, " ranks"));
  }
  DeviceMesh mesh(std::move(layout), rank, std::move(make_device_group));
  KEEL_RETURN_IF_ERROR(mesh.CreateKindGroups(store, timeout));
  auto world_group = [&](const char* name) {
    return CreateProcessGroup(
        Backend::kGloo, c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("mesh/", name), store),
        rank, world_size, timeout);
  };
  for (GroupKind kind : kGroupKinds) {
    if (mesh.GroupSize(kind) == world_size) {
      mesh.control_ = mesh.gloo_groups_[Index(kind)];
      break;
    }
  }
  if (!mesh.control_) {
    KEEL_ASSIGN_OR_RETURN(mesh.control_, world_group("control"));
  }
  KEEL_ASSIGN_OR_RETURN(mesh.checkpoint_, world_group("checkpoint"));
  mesh.store_ = c10::make_intrusive<c10d::PrefixStore>("mesh/store", store);
  return mesh;
}

absl::Status DeviceMesh::CreateKindGroups(const c10::intrusive_ptr<c10d::Store>& store,
                                          std::chrono::milliseconds timeout) {
  std::vector<GroupKind> created;
  for (GroupKind kind : kGroupKinds) {
    const std::optional<int> index = layout_.GroupIndex(kind, rank_);
    if (!index.has_value()) continue;
    const std::vector<int>& members = GroupRanks(kind);
    const size_t i = Index(kind);
    for (GroupKind earlier : created) {
      if (GroupRanks(earlier) == members) {
        groups_[i] = groups_[Index(earlier)];
        gloo_groups_[i] = gloo_groups_[Index(earlier)];
        break;
      }
    }
    if (groups_[i]) continue;
    const std::string prefix = absl::StrCat("mesh/", GroupKindName(kind), "/", *index);
    const std::string what = absl::StrCat("creating the ", GroupKindName(kind), " group [",
                                          absl::StrJoin(members, ", "), "]");
    auto created_as = [&](absl::StatusOr<c10::intrusive_ptr<c10d::ProcessGroup>> group,
                          c10::intrusive_ptr<c10d::ProcessGroup>& out) -> absl::Status {
      KEEL_RETURN_IF_ERROR(base::Annotate(group.status(), what));
      out = *std::move(group);
      return absl::OkStatus();
    };
    const int group_rank = GroupRank(kind), size = static_cast<int>(members.size());
    auto gloo = [&](const std::string& name) {
      return CreateProcessGroup(Backend::kGloo, c10::make_intrusive<c10d::PrefixStore>(name, store),
                                group_rank, size, timeout);
    };
    if (!make_device_group_) {
      KEEL_RETURN_IF_ERROR(created_as(gloo(prefix), groups_[i]));
      gloo_groups_[i] = groups_[i];
    } else {
      KEEL_RETURN_IF_ERROR(
          created_as(make_device_group_(c10::make_intrusive<c10d::PrefixStore>(prefix, store),
                                        group_rank, size, timeout),
                     groups_[i]));
      KEEL_RETURN_IF_ERROR(created_as(gloo(prefix + "/gloo"), gloo_groups_[i]));
    }
    created.push_back(kind);
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceMesh> DeviceMesh::Connect(const WorkerEnv& env,
                                               const ModelParallelOptions& options, Backend backend,
                                               std::chrono::milliseconds timeout) {
  KEEL_ASSIGN_OR_RETURN(MeshLayout layout, MeshLayout::Create(options, env.world_size));
  KEEL_ASSIGN_OR_RETURN(const c10::intrusive_ptr<c10d::Store> store, ConnectStore(env, timeout));
  return Create(std::move(layout), env.rank, store, backend, timeout);
}

c10d::ProcessGroup* DeviceMesh::Group(GroupKind kind) const { return groups_[Index(kind)].get(); }

c10d::ProcessGroup* DeviceMesh::GlooGroup(GroupKind kind) const {
  return gloo_groups_[Index(kind)].get();
}

int DeviceMesh::GroupRank(GroupKind kind) const {
  return layout_.Coordinate(kind, rank_).value_or(-1);
}

int DeviceMesh::GroupSize(GroupKind kind) const {
  const std::optional<int> index = layout_.GroupIndex(kind, rank_);
  if (!index.has_value()) return -1;
  return static_cast<int>(layout_.Groups(kind)[static_cast<size_t>(*index)].size());
}

const std::vector<int>& DeviceMesh::GroupRanks(GroupKind kind) const {
  const std::optional<int> index = layout_.GroupIndex(kind, rank_);
  if (!index.has_value()) return NoRanks();
  return layout_.Groups(kind)[static_cast<size_t>(*index)];
}

}  // namespace keel::parallel
