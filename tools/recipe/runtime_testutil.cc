#include "tools/recipe/runtime_testutil.h"

#include <utility>

#include "base/status.h"
#include "parallel/process_group.h"
#include "torch/csrc/distributed/c10d/PrefixStore.hpp"

namespace keel::tools::recipe {

absl::StatusOr<parallel::DeviceMesh> GlooMesh(const keel::testing::Rank& r,
                                              const parallel::ModelParallelOptions& options,
                                              std::chrono::milliseconds timeout) {
  KEEL_ASSIGN_OR_RETURN(parallel::MeshLayout layout,
                        parallel::MeshLayout::Create(options, r.world_size));
  return parallel::DeviceMesh::Create(std::move(layout), r.rank,
                                      c10::make_intrusive<c10d::PrefixStore>("mesh", r.store),
                                      parallel::Backend::kGloo, timeout);
}

}  // namespace keel::tools::recipe
