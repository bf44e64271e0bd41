#include "parallel/mesh_cases.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "parallel/mesh_layout.h"

namespace keel::parallel {

using base::Json;

absl::StatusOr<Json> RunMeshCase(const Json& inputs) {
  ModelParallelOptions options;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(inputs, options, "inputs."));
  int64_t world_size = 0;
  KEEL_RETURN_IF_ERROR(
      base::FromJson(inputs.value("world_size", Json()), "inputs.world_size", world_size));
  std::vector<int64_t> query_ranks;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("query_ranks", Json::array()),
                                      "inputs.query_ranks", query_ranks));
  if (world_size < 1 || world_size > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs.world_size (", world_size, ") must be in [1, 2^31 - 1]"));
  }
  KEEL_ASSIGN_OR_RETURN(const MeshLayout layout,
                        MeshLayout::Create(options, static_cast<int>(world_size)));

  Json groups = Json::object();
  for (GroupKind kind : kGroupKinds) groups[std::string(GroupKindName(kind))] = layout.Groups(kind);
  Json ranks = Json::array();
  for (const int64_t rank : query_ranks) {
    if (rank < 0 || rank >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs.query_ranks: rank ", rank, " is outside world_size ", world_size));
    }
    Json coordinates = {{"rank", rank}};
    for (GroupKind kind : kGroupKinds) {
      const std::optional<int> coordinate = layout.Coordinate(kind, static_cast<int>(rank));
      coordinates[std::string(GroupKindName(kind))] =
          coordinate.has_value() ? Json(*coordinate) : Json(nullptr);
    }
    ranks.push_back(std::move(coordinates));
  }
  return Json{{"data_parallel_size", layout.data_parallel_size()},
              {"expert_tensor_parallel_size", layout.expert_tensor_parallel_size()},
              {"expert_data_parallel_size", layout.expert_data_parallel_size()},
              {"groups", std::move(groups)},
              {"ranks", std::move(ranks)}};
}

}  // namespace keel::parallel
