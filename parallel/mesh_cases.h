// Runs one mesh golden case (testdata/golden/mesh.json) through Keel, for the parity test and
// //tools:parity. The inputs and the result have the golden file's shape; see
// testdata/golden/README.md.
#ifndef KEEL_PARALLEL_MESH_CASES_H_
#define KEEL_PARALLEL_MESH_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::parallel {

// Builds the MeshLayout of inputs.world_size and the ModelParallelOptions fields in `inputs`,
// and returns {data_parallel_size, expert_tensor_parallel_size, expert_data_parallel_size,
// groups: {<kind>: [[ranks]...]}, ranks: [{rank, <kind>: coordinate or null}]} for
// inputs.query_ranks. Errors: kInvalidArgument when Keel refuses the inputs or they are
// malformed (a query rank outside the world included).
[[nodiscard]] absl::StatusOr<base::Json> RunMeshCase(const base::Json& inputs);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_MESH_CASES_H_
