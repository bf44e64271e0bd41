#include "parallel/mesh_layout.h"

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/enum.h"
#include "base/status.h"

namespace keel::parallel {
namespace {

// The axes of Megatron's rank generators, by their order tokens.
enum class Axis { kTp, kCp, kEp, kDp, kPp };
constexpr int kNumAxes = 5;

constexpr base::EnumSpelling<Axis> kAxisSpellings[] = {
    {Axis::kTp, "tp"}, {Axis::kCp, "cp"}, {Axis::kEp, "ep"}, {Axis::kDp, "dp"}, {Axis::kPp, "pp"},
};

constexpr base::EnumSpelling<GroupKind> kGroupKindSpellings[] = {
    {GroupKind::kDpCp, "dp-cp"},
    {GroupKind::kDp, "dp"},
    {GroupKind::kCp, "cp"},
    {GroupKind::kTpPp, "tp-pp"},
    {GroupKind::kTp, "tp"},
    {GroupKind::kPp, "pp"},
    {GroupKind::kEmbedding, "embedding"},
    {GroupKind::kPositionEmbedding, "position_embedding"},
    {GroupKind::kTpDpCp, "tp-dp-cp"},
    {GroupKind::kTpDp, "tp-dp"},
    {GroupKind::kTpCp, "tp-cp"},
    {GroupKind::kEp, "ep"},
    {GroupKind::kExpertTp, "expert_tp"},
    {GroupKind::kTpEp, "tp-ep"},
    {GroupKind::kTpEpPp, "tp-ep-pp"},
    {GroupKind::kExpertDp, "expert_dp"},
};

// One axis of a grid: its size and the value it comes from, for messages.
struct AxisSize {
  int64_t size = 1;
  const char* source = "";
};
using GridSizes = std::array<AxisSize, kNumAxes>;

// Which grid a kind's groups come from and which axes they span (Megatron's get_ranks token).
struct KindSpec {
  GroupKind kind;
  bool expert;
  std::initializer_list<Axis> mask;
};

// kEmbedding and kPositionEmbedding derive from kPp instead.
const KindSpec kKindSpecs[] = {
    {GroupKind::kDpCp, false, {Axis::kDp, Axis::kCp}},
    {GroupKind::kDp, false, {Axis::kDp}},
    {GroupKind::kCp, false, {Axis::kCp}},
    {GroupKind::kTpPp, false, {Axis::kTp, Axis::kPp}},
    {GroupKind::kTp, false, {Axis::kTp}},
    {GroupKind::kPp, false, {Axis::kPp}},
    {GroupKind::kTpDpCp, false, {Axis::kTp, Axis::kDp, Axis::kCp}},
    {GroupKind::kTpDp, false, {Axis::kTp, Axis::kDp}},
    {GroupKind::kTpCp, false, {Axis::kTp, Axis::kCp}},
    {GroupKind::kEp, true, {Axis::kEp}},
    {GroupKind::kExpertTp, true, {Axis::kTp}},
    {GroupKind::kTpEp, true, {Axis::kTp, Axis::kEp}},
    {GroupKind::kTpEpPp, true, {Axis::kTp, Axis::kEp, Axis::kPp}},
    {GroupKind::kExpertDp, true, {Axis::kDp}},
};

size_t Index(Axis axis) { return static_cast<size_t>(axis); }
size_t Index(GroupKind kind) { return static_cast<size_t>(kind); }

absl::Status CheckSizesPositive(const ModelParallelOptions& options, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size (", world_size, ") must be >= 1"));
  }
  absl::Status status;
  auto check = [&](absl::string_view name, int64_t size) {
    if (status.ok() && size < 1) {
      status = absl::InvalidArgumentError(absl::StrCat(name, " (", size, ") must be >= 1"));
    }
  };
  VisitFields(options, [&](absl::string_view name, const auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, int64_t>) {
      check(name, field);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      if (field.has_value()) check(name, *field);
    }
  });
  return status;
}

// world_size / (product of `factors`), or an error naming each factor when that does not divide
// it (where Megatron raises RuntimeError).
absl::StatusOr<int> Quotient(int world_size,
                             std::initializer_list<std::pair<const char*, int64_t>> factors) {
  int64_t product = 1;
  bool exceeds = false;
  std::vector<std::string> terms;
  for (const auto& [name, size] : factors) {
    terms.push_back(absl::StrCat(name, " (", size, ")"));
    exceeds = exceeds || size > world_size / product;
    if (!exceeds) product *= size;
  }
  if (exceeds || world_size % product != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size (", world_size, ") is not divisible by ", absl::StrJoin(terms, " x "),
        exceeds ? ", whose product exceeds it" : absl::StrCat(" = ", product)));
  }
  return static_cast<int>(world_size / product);
}

// The axes `order` names, fastest-varying first.
absl::StatusOr<std::vector<Axis>> ParseOrder(const std::string& order) {
  std::vector<Axis> axes;
  for (absl::string_view token : absl::StrSplit(order, '-')) {
    Axis axis;
    std::string error;
    if (!base::ParseEnum(kAxisSpellings, token, &axis, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("order \"", order, "\": token ", error, " (lower case, '-' between)"));
    }
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("order \"", order, "\" names ", token, " twice; name each axis once"));
    }
    axes.push_back(axis);
  }
  if (std::find(axes.begin(), axes.end(), Axis::kTp) == axes.end()) {
    // Megatron-Core inserts its gtp_remat axis after tp and then fails looking tp up.
    return absl::InvalidArgumentError(
        absl::StrCat("order \"", order, "\" does not name tp, which Megatron-Core requires"));
  }
  return axes;
}

// Megatron's RankGenerator check: an axis of size above 1 must be in the order (axes of size
// 1 that it leaves out change no group).
absl::Status CheckNamed(const std::string& order, const std::vector<Axis>& axes,
                        const GridSizes& sizes) {
  for (const auto& [axis, token] : kAxisSpellings) {
    const AxisSize& size = sizes[Index(axis)];
    if (size.size > 1 && std::find(axes.begin(), axes.end(), axis) == axes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("order \"", order, "\" does not name ", token,
                                                     ", whose size is ", size.size, " (",
                                                     size.source, "); name every axis above 1"));
    }
  }
  return absl::OkStatus();
}

// generate_masked_orthogonal_rank_groups: the grid's ranks are
// sum_i coordinate_i * stride_i, strides the prefix products of the sizes in order; a group
// varies the masked axes and fixes the others. Groups come by the unmasked coordinates and
// ranks inside a group by the masked ones, first axis fastest, so both ascend.
std::vector<std::vector<int>> MaskedGroups(const std::vector<Axis>& axes, const GridSizes& sizes,
                                           int world_size, std::initializer_list<Axis> mask) {
  struct Dim {
    int size;
    int stride;
  };
  std::vector<Dim> masked, unmasked;
  int stride = 1;
  for (Axis axis : axes) {
    const int size = static_cast<int>(sizes[Index(axis)].size);
    const bool in_mask = std::find(mask.begin(), mask.end(), axis) != mask.end();
    (in_mask ? masked : unmasked).push_back({size, stride});
    stride *= size;
  }
  auto offset = [](const std::vector<Dim>& dims, int index) {
    int rank = 0;
    for (const Dim& dim : dims) {
      rank += (index % dim.size) * dim.stride;
      index /= dim.size;
    }
    return rank;
  };
  int group_size = 1;
  for (const Dim& dim : masked) group_size *= dim.size;
  std::vector<std::vector<int>> groups(static_cast<size_t>(world_size / group_size));
  for (size_t g = 0; g < groups.size(); ++g) {
    const int base = offset(unmasked, static_cast<int>(g));
    groups[g].reserve(static_cast<size_t>(group_size));
    for (int i = 0; i < group_size; ++i) groups[g].push_back(base + offset(masked, i));
  }
  return groups;
}

// Megatron's assertion that both grids place the pipeline stages alike.
absl::Status CheckSamePipelines(const std::vector<std::vector<int>>& dense,
                                const std::vector<std::vector<int>>& expert,
                                const std::string& order) {
  for (size_t g = 0; g < dense.size(); ++g) {
    if (dense[g] != expert[g]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "order \"", order, "\" gives the dense and expert layers different pipeline groups: ",
          "group ", g, " is [", absl::StrJoin(dense[g], ", "), "] for the dense layers and [",
          absl::StrJoin(expert[g], ", "), "] for the experts; order the axes so that ",
          "pipeline stages hold the same ranks (pp last always does)"));
    }
  }
  return absl::OkStatus();
}

// default_embedding_ranks / default_position_embedding_ranks of each pipeline group.
std::vector<std::vector<int>> StageGroups(const std::vector<std::vector<int>>& pp_groups,
                                          bool with_last) {
  std::vector<std::vector<int>> groups;
  for (const std::vector<int>& pp : pp_groups) {
    groups.push_back({pp.front()});
    if (with_last && pp.size() > 1) groups.back().push_back(pp.back());
  }
  return groups;
}

// The order's axes and the sizes of both grids, after every check of initialize_model_parallel
// up to its pipeline-group assertion, in its order.
struct Grids {
  std::vector<Axis> axes;
  GridSizes dense;
  GridSizes expert;
};

absl::StatusOr<Grids> PlanGrids(const ModelParallelOptions& o, int world_size) {
  KEEL_RETURN_IF_ERROR(CheckSizesPositive(o, world_size));
  const int64_t pp = o.pipeline_model_parallel_size;
  const absl::StatusOr<int> dp =
      Quotient(world_size, {{"tensor_model_parallel_size", o.tensor_model_parallel_size},
                            {"pipeline_model_parallel_size", pp},
                            {"context_parallel_size", o.context_parallel_size}});
  KEEL_RETURN_IF_ERROR(dp.status());
  if (o.virtual_pipeline_model_parallel_size.has_value() && pp == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "virtual_pipeline_model_parallel_size (", *o.virtual_pipeline_model_parallel_size,
        ") needs pipeline_model_parallel_size > 1 (the interleaved schedule), got 1"));
  }
  Grids grids;
  KEEL_ASSIGN_OR_RETURN(grids.axes, ParseOrder(o.order));
  grids.dense = {{{o.tensor_model_parallel_size, "tensor_model_parallel_size"},
                  {o.context_parallel_size, "context_parallel_size"},
                  {1, "the dense layers have no ep"},
                  {*dp, "data_parallel_size"},
                  {pp, "pipeline_model_parallel_size"}}};
  KEEL_RETURN_IF_ERROR(CheckNamed(o.order, grids.axes, grids.dense));

  const int64_t etp = o.expert_tensor_parallel_size.value_or(o.tensor_model_parallel_size);
  const absl::StatusOr<int> edp =
      Quotient(world_size, {{"expert_tensor_parallel_size", etp},
                            {"expert_model_parallel_size", o.expert_model_parallel_size},
                            {"pipeline_model_parallel_size", pp}});
  KEEL_RETURN_IF_ERROR(edp.status());
  grids.expert = {{{etp, "expert_tensor_parallel_size"},
                   {1, "the experts have no cp"},
                   {o.expert_model_parallel_size, "expert_model_parallel_size"},
                   {*edp, "expert_data_parallel_size"},
                   {pp, "pipeline_model_parallel_size"}}};
  KEEL_RETURN_IF_ERROR(CheckNamed(o.order, grids.axes, grids.expert));
  if (grids.axes.back() != Axis::kPp && pp > 1 && *edp != *dp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "order \"", o.order, "\" does not end with pp and pipeline_model_parallel_size is ", pp,
        ", so the data-parallel sizes of the dense layers (", *dp, ") and of the experts (", *edp,
        ") must be equal"));
  }
  return grids;
}

}  // namespace

absl::StatusOr<GroupKind> ParseGroupKind(absl::string_view token) {
  GroupKind kind;
  std::string error;
  if (!base::ParseEnum(kGroupKindSpellings, token, &kind, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("group kind ", error));
  }
  return kind;
}

absl::string_view GroupKindName(GroupKind kind) {
  return base::EnumName(kGroupKindSpellings, kind);
}

absl::StatusOr<MeshLayout> MeshLayout::Create(const ModelParallelOptions& options, int world_size) {
  KEEL_ASSIGN_OR_RETURN(const Grids grids, PlanGrids(options, world_size));
  MeshLayout layout;
  for (const KindSpec& spec : kKindSpecs) {
    layout.kinds_[Index(spec.kind)].groups =
        MaskedGroups(grids.axes, spec.expert ? grids.expert : grids.dense, world_size, spec.mask);
  }
  const std::vector<std::vector<int>>& pp = layout.kinds_[Index(GroupKind::kPp)].groups;
  KEEL_RETURN_IF_ERROR(CheckSamePipelines(
      pp, MaskedGroups(grids.axes, grids.expert, world_size, {Axis::kPp}), options.order));
  layout.kinds_[Index(GroupKind::kEmbedding)].groups = StageGroups(pp, /*with_last=*/true);
  layout.kinds_[Index(GroupKind::kPositionEmbedding)].groups = StageGroups(pp, /*with_last=*/false);
  for (KindGroups& kind : layout.kinds_) {
    kind.group_of_rank.assign(static_cast<size_t>(world_size), -1);
    for (size_t g = 0; g < kind.groups.size(); ++g) {
      for (int rank : kind.groups[g]) {
        kind.group_of_rank[static_cast<size_t>(rank)] = static_cast<int>(g);
      }
    }
  }
  layout.options_ = options;
  layout.world_size_ = world_size;
  layout.data_parallel_size_ = static_cast<int>(grids.dense[Index(Axis::kDp)].size);
  layout.expert_tensor_parallel_size_ = static_cast<int>(grids.expert[Index(Axis::kTp)].size);
  layout.expert_data_parallel_size_ = static_cast<int>(grids.expert[Index(Axis::kDp)].size);
  return layout;
}

const std::vector<std::vector<int>>& MeshLayout::Groups(GroupKind kind) const {
  return kinds_[Index(kind)].groups;
}

std::optional<int> MeshLayout::GroupIndex(GroupKind kind, int rank) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  const int g = kinds_[Index(kind)].group_of_rank[static_cast<size_t>(rank)];
  if (g < 0) return std::nullopt;
  return g;
}

std::optional<int> MeshLayout::Coordinate(GroupKind kind, int rank) const {
  const std::optional<int> g = GroupIndex(kind, rank);
  if (!g.has_value()) return std::nullopt;
  const std::vector<int>& group = kinds_[Index(kind)].groups[static_cast<size_t>(*g)];
  return static_cast<int>(std::lower_bound(group.begin(), group.end(), rank) - group.begin());
}

}  // namespace keel::parallel
