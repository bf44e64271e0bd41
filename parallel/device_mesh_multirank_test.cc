#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/types.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr std::chrono::seconds kTimeout(20);

ModelParallelOptions Sizes(int64_t tp, int64_t pp, int64_t ep = 1) {
  ModelParallelOptions options;
  options.tensor_model_parallel_size = tp;
  options.pipeline_model_parallel_size = pp;
  options.expert_model_parallel_size = ep;
  return options;
}

// The sum of the global ranks in `group`, all-reduced over it.
absl::StatusOr<int64_t> SumOfRanks(c10d::ProcessGroup& group, int rank, const std::string& what) {
  at::Tensor value = torch::full({1}, rank, torch::kInt64);
  KEEL_RETURN_IF_ERROR(base::AllReduce(value, base::Reduce::kSum, group, what));
  return value.item<int64_t>();
}

// On one rank of a mesh: for every kind, its coordinate and group size agree with the layout,
// and an all-reduce SUM of the global ranks over its device and Gloo groups gives the sum of
// the group's members in the layout. The same over the control and checkpoint groups.
absl::Status CheckMesh(const DeviceMesh& mesh, const MeshLayout& layout) {
  const int rank = mesh.rank();
  for (GroupKind kind : kGroupKinds) {
    const std::string what(GroupKindName(kind));
    const std::optional<int> index = layout.GroupIndex(kind, rank);
    if (!index.has_value()) {
      if (mesh.Group(kind) != nullptr || mesh.GroupRank(kind) != -1 || mesh.GroupSize(kind) != -1) {
        return absl::InternalError(absl::StrCat(what, ": a group outside every group"));
      }
      continue;
    }
    const std::vector<int>& members = layout.Groups(kind)[static_cast<size_t>(*index)];
    int64_t expected = 0;
    for (int member : members) expected += member;
    if (mesh.GroupRank(kind) != layout.Coordinate(kind, rank) ||
        mesh.GroupSize(kind) != static_cast<int>(members.size()) ||
        mesh.GroupRanks(kind) != members || mesh.Group(kind)->getRank() != mesh.GroupRank(kind) ||
        mesh.Group(kind)->getSize() != mesh.GroupSize(kind)) {
      return absl::InternalError(absl::StrCat(what, ": coordinates differ from the layout's"));
    }
    for (c10d::ProcessGroup* group : {mesh.Group(kind), mesh.GlooGroup(kind)}) {
      KEEL_ASSIGN_OR_RETURN(const int64_t sum, SumOfRanks(*group, rank, what));
      if (sum != expected) {
        return absl::InternalError(absl::StrCat(what, ": sum ", sum, ", expected ", expected));
      }
    }
  }
  const int64_t world = mesh.world_size();
  for (c10d::ProcessGroup* group : {mesh.control_group(), mesh.checkpoint_group()}) {
    KEEL_ASSIGN_OR_RETURN(const int64_t sum, SumOfRanks(*group, rank, "world"));
    if (sum != world * (world - 1) / 2) return absl::InternalError("a world group's sum");
  }
  return absl::OkStatus();
}

struct MeshCase {
  std::string name;
  ModelParallelOptions options;
  int world_size;
};

TEST(DeviceMeshMultiRankTest, EveryKindsGroupReducesOverExactlyItsMembers) {
  ModelParallelOptions expert = Sizes(2, 2, 2);
  expert.expert_tensor_parallel_size = 1;
  ModelParallelOptions pp_first = Sizes(2, 2);
  pp_first.order = "tp-pp-dp";
  const std::vector<MeshCase> cases = {
      {"dp_only_w3", {}, 3},
      {"pp3_w3", Sizes(1, 3), 3},  // odd: the last stage has no position-embedding group
      {"tp2_pp2_w8", Sizes(2, 2), 8},
      {"tp2_pp2_order_tp_pp_dp_w8", pp_first, 8},
      {"tp2_pp2_ep2_etp1_w8", expert, 8},
      {"tp2_ep2_w4", Sizes(2, 1, 2), 4},
  };
  for (const MeshCase& c : cases) {
    SCOPED_TRACE(c.name);
    KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(c.options, c.world_size));
    KEEL_EXPECT_OK(testing::RunOnRanksWithStore(c.world_size, [&](Rank& r) -> absl::Status {
      KEEL_ASSIGN_OR_RETURN(const DeviceMesh mesh,
                            DeviceMesh::Create(layout, r.rank, r.store, Backend::kGloo, kTimeout));
      return CheckMesh(mesh, layout);
    }));
  }
}

// In a data-parallel layout the dense and expert data-parallel kinds are one world group,
// which the control group shares; every size-one kind shares another; checkpoints get their own.
TEST(DeviceMeshMultiRankTest, KindsWithTheSameMembersShareOneGroup) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create({}, 2));
  KEEL_EXPECT_OK(testing::RunOnRanksWithStore(2, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(const DeviceMesh mesh,
                          DeviceMesh::Create(layout, r.rank, r.store, Backend::kGloo, kTimeout));
    c10d::ProcessGroup* dp = mesh.Group(GroupKind::kDp);
    const bool shared = dp == mesh.Group(GroupKind::kDpCp) && dp == mesh.Group(GroupKind::kTpDp) &&
                        dp == mesh.Group(GroupKind::kExpertDp) &&
                        dp == mesh.GlooGroup(GroupKind::kDp) && dp == mesh.control_group() &&
                        mesh.Group(GroupKind::kTp) == mesh.Group(GroupKind::kPp) &&
                        mesh.Group(GroupKind::kTp) != dp && mesh.checkpoint_group() != dp;
    return shared ? CheckMesh(mesh, layout) : absl::InternalError("groups not shared as expected");
  }));
}

// Gloo with one rank: no c10d group at all, and no store is needed; ranks and sizes answer.
TEST(DeviceMeshTest, SingleGlooProcessHasNoGroupsButAnswersCoordinates) {
  KEEL_ASSERT_OK_AND_ASSIGN(MeshLayout layout, MeshLayout::Create({}, 1));
  KEEL_ASSERT_OK_AND_ASSIGN(const DeviceMesh mesh,
                            DeviceMesh::Create(std::move(layout), 0, {}, Backend::kGloo, kTimeout));
  for (GroupKind kind : kGroupKinds) {
    SCOPED_TRACE(GroupKindName(kind));
    EXPECT_EQ(mesh.Group(kind), nullptr);
    EXPECT_EQ(mesh.GlooGroup(kind), nullptr);
    EXPECT_EQ(mesh.GroupRank(kind), 0);
    EXPECT_EQ(mesh.GroupSize(kind), 1);
    EXPECT_EQ(mesh.GroupRanks(kind), std::vector<int>{0});
  }
  EXPECT_EQ(mesh.control_group(), nullptr);
  EXPECT_EQ(mesh.checkpoint_group(), nullptr);
  EXPECT_EQ(mesh.world_size(), 1);
}

TEST(DeviceMeshTest, RefusesARankOutsideTheWorld) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create({}, 2));
  EXPECT_THAT(DeviceMesh::Create(layout, 2, {}, Backend::kGloo, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 2 is outside the world of 2 ranks")));
}

// Connect from a torchrun-style environment: rank 0 serves the TCPStore, rank 1 connects.
TEST(DeviceMeshMultiRankTest, ConnectBuildsTheMeshFromAWorkerEnvironment) {
  const int port = testing::FreeTcpPort();
  ASSERT_GT(port, 0);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      WorkerEnv env;
      env.rank = rank;
      env.local_rank = rank;
      env.world_size = 2;
      env.local_world_size = 2;
      env.master_port = port;
      absl::StatusOr<DeviceMesh> mesh =
          DeviceMesh::Connect(env, Sizes(2, 1), Backend::kGloo, kTimeout);
      statuses[rank] = mesh.ok() ? CheckMesh(*mesh, mesh->layout()) : mesh.status();
      if (statuses[rank].ok() && mesh->GroupRank(GroupKind::kTp) != rank) {
        statuses[rank] = absl::InternalError("tp coordinate");
      }
    });
  }
  for (std::thread& thread : ranks) thread.join();
  for (const absl::Status& status : statuses) KEEL_EXPECT_OK(status);
}

TEST(DeviceMeshTest, ConnectReportsAnInvalidLayoutBeforeAnyRendezvous) {
  WorkerEnv env;
  env.world_size = 6;
  EXPECT_THAT(DeviceMesh::Connect(env, Sizes(4, 1), Backend::kGloo, kTimeout),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("world_size (6) is not divisible by")));
}

}  // namespace
}  // namespace keel::parallel
