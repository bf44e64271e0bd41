// Trainer runtimes for tests whose ranks are RunOnRanks threads: a Gloo DeviceMesh of a layout
// over the ranks' store, which TrainRuntime's groups come from as in a launched run.
//
//   KEEL_ASSIGN_OR_RETURN(parallel::DeviceMesh mesh, GlooMesh(r));
//   TrainRuntime runtime;
//   AttachMesh(mesh, at::kCPU, runtime);
#ifndef KEEL_TOOLS_RECIPE_RUNTIME_TESTUTIL_H_
#define KEEL_TOOLS_RECIPE_RUNTIME_TESTUTIL_H_

#include <chrono>

#include "absl/status/statusor.h"
#include "parallel/device_mesh.h"
#include "parallel/mesh_layout.h"
#include "testing/ranks.h"

namespace keel::tools::recipe {

// The mesh of `options`' layout over r.world_size ranks, through r.store (under a prefix of
// its own), its collectives timing out after `timeout`. Collective: every rank calls it.
// Errors: MeshLayout::Create's and DeviceMesh::Create's.
[[nodiscard]] absl::StatusOr<parallel::DeviceMesh> GlooMesh(
    const keel::testing::Rank& r, const parallel::ModelParallelOptions& options = {},
    std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_RUNTIME_TESTUTIL_H_
