// Megatron-Core's process-group layout as plain data, without LibTorch: which global ranks form
// each tensor-, pipeline-, context-, data- and expert-parallel group, group for group and in
// the same order as initialize_model_parallel and its RankGenerator /
// generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py). A DeviceMesh
// (parallel/device_mesh.h) creates the groups that contain its rank from this.
//
//   keel::parallel::ModelParallelOptions options;
//   options.tensor_model_parallel_size = 2;
//   options.pipeline_model_parallel_size = 2;
//   KEEL_ASSIGN_OR_RETURN(auto layout, keel::parallel::MeshLayout::Create(options, 8));
//   layout.data_parallel_size();                       // 2
//   layout.Groups(keel::parallel::GroupKind::kTp);     // [[0, 1], [2, 3], [4, 5], [6, 7]]
//   layout.Coordinate(keel::parallel::GroupKind::kPp, 5);  // 1
#ifndef KEEL_PARALLEL_MESH_LAYOUT_H_
#define KEEL_PARALLEL_MESH_LAYOUT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"

namespace keel::parallel {

// Mirrors initialize_model_parallel's layout arguments: same names, order and defaults. The
// world size is MeshLayout::Create's argument. Left out because Keel has no use for them yet
// (Megatron's defaults apply): gtp_remat_size, expert_gtp_remat_size,
// num_distributed_optimizer_instances (1), hierarchical and hybrid context parallelism, custom
// embedding-rank functions, rank_offset (0).
struct ModelParallelOptions {
  // Ranks one tensor is split across. Default: 1.
  int64_t tensor_model_parallel_size = 1;
  // Pipeline stages the layers are split across. Default: 1.
  int64_t pipeline_model_parallel_size = 1;
  // Model chunks per pipeline stage (interleaved schedule); needs pipeline_model_parallel_size
  // > 1. Changes no group. Default: nullopt.
  std::optional<int64_t> virtual_pipeline_model_parallel_size;
  // Ranks one sequence is split across. Default: 1.
  int64_t context_parallel_size = 1;
  // Ranks the experts of a MoE layer are spread over. Default: 1.
  int64_t expert_model_parallel_size = 1;
  // Ranks one expert's tensors are split across; nullopt is tensor_model_parallel_size.
  // Default: nullopt.
  std::optional<int64_t> expert_tensor_parallel_size;
  // Axes from the fastest-varying (adjacent ranks) to the slowest, hyphen-separated tokens
  // tp, cp, ep, dp, pp, each at most once; tp must be named, and so must every axis whose
  // size is above 1. Default: "tp-cp-ep-dp-pp".
  std::string order = "tp-cp-ep-dp-pp";
};

template <typename O, typename V, base::IsFieldsOf<O, ModelParallelOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("tensor_model_parallel_size", o.tensor_model_parallel_size);
  v("pipeline_model_parallel_size", o.pipeline_model_parallel_size);
  v("virtual_pipeline_model_parallel_size", o.virtual_pipeline_model_parallel_size);
  v("context_parallel_size", o.context_parallel_size);
  v("expert_model_parallel_size", o.expert_model_parallel_size);
  v("expert_tensor_parallel_size", o.expert_tensor_parallel_size);
  v("order", o.order);
}

// The kinds of group initialize_model_parallel creates, in its creation order, spelled by
// Megatron's rank-generator tokens. The first eleven come from the dense (decoder) grid of
// tp x cp x dp x pp: kTpPp is Megatron's model-parallel group, kEmbedding the first and last
// stage of each pipeline group, kPositionEmbedding its first stage. The last five come from the
// expert grid of expert tp x ep x expert dp x pp.
enum class GroupKind {
  kDpCp,               // "dp-cp"
  kDp,                 // "dp"
  kCp,                 // "cp"
  kTpPp,               // "tp-pp"
  kTp,                 // "tp"
  kPp,                 // "pp"
  kEmbedding,          // "embedding"
  kPositionEmbedding,  // "position_embedding"
  kTpDpCp,             // "tp-dp-cp"
  kTpDp,               // "tp-dp"
  kTpCp,               // "tp-cp"
  kEp,                 // "ep"
  kExpertTp,           // "expert_tp"
  kTpEp,               // "tp-ep"
  kTpEpPp,             // "tp-ep-pp"
  kExpertDp,           // "expert_dp"
};

inline constexpr int kNumGroupKinds = 16;

// Every kind, in creation order.
inline constexpr std::array<GroupKind, kNumGroupKinds> kGroupKinds = {
    GroupKind::kDpCp,     GroupKind::kDp,   GroupKind::kCp,        GroupKind::kTpPp,
    GroupKind::kTp,       GroupKind::kPp,   GroupKind::kEmbedding, GroupKind::kPositionEmbedding,
    GroupKind::kTpDpCp,   GroupKind::kTpDp, GroupKind::kTpCp,      GroupKind::kEp,
    GroupKind::kExpertTp, GroupKind::kTpEp, GroupKind::kTpEpPp,    GroupKind::kExpertDp,
};

// The kind spelled exactly `token` (one of the spellings above). Errors: kInvalidArgument
// quoting `token` and listing every spelling.
[[nodiscard]] absl::StatusOr<GroupKind> ParseGroupKind(absl::string_view token);

// The spelling of `kind`.
absl::string_view GroupKindName(GroupKind kind);

// One world's groups of every kind. Ranks are global ranks 0..world_size-1; each group lists
// its ranks in ascending order, which is also their order inside the group (a rank's
// coordinate is its index there, torch.distributed.get_rank(group)).
class MeshLayout {
 public:
  // Derives the data-parallel sizes and every group. Errors: kInvalidArgument, naming the
  // values and what is allowed, when world_size < 1 or a size < 1; when world_size is not
  // divisible by tp x pp x cp, or by expert tp x ep x pp; for virtual_pipeline_model_parallel_size
  // with pipeline_model_parallel_size 1; for an order with an unknown or repeated token, without
  // tp, or without an axis whose size is above 1; when the order does not end with pp, pp > 1
  // and the dense and expert data-parallel sizes differ; when the two grids' pipeline groups
  // differ.
  [[nodiscard]] static absl::StatusOr<MeshLayout> Create(const ModelParallelOptions& options,
                                                         int world_size);

  // The options as given (expert_tensor_parallel_size may be nullopt).
  const ModelParallelOptions& options() const { return options_; }
  int world_size() const { return world_size_; }
  // world_size / (tp x pp x cp).
  int data_parallel_size() const { return data_parallel_size_; }
  // The option, or tensor_model_parallel_size when it is nullopt.
  int expert_tensor_parallel_size() const { return expert_tensor_parallel_size_; }
  // world_size / (expert tp x ep x pp).
  int expert_data_parallel_size() const { return expert_data_parallel_size_; }

  // Every group of `kind`, in Megatron's creation order. The groups of a kind are disjoint;
  // they cover every rank except for kEmbedding and kPositionEmbedding.
  const std::vector<std::vector<int>>& Groups(GroupKind kind) const;
  // The index in Groups(kind) of the group holding `rank`; nullopt when none does (or `rank`
  // is not in 0..world_size-1).
  std::optional<int> GroupIndex(GroupKind kind, int rank) const;
  // The index of `rank` inside its group of `kind`; nullopt when no group holds it.
  std::optional<int> Coordinate(GroupKind kind, int rank) const;

 private:
  struct KindGroups {
    std::vector<std::vector<int>> groups;
    std::vector<int> group_of_rank;  // -1: in none
  };

  MeshLayout() = default;

  ModelParallelOptions options_;
  int world_size_ = 1;
  int data_parallel_size_ = 1;
  int expert_tensor_parallel_size_ = 1;
  int expert_data_parallel_size_ = 1;
  std::array<KindGroups, kNumGroupKinds> kinds_;
};

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_MESH_LAYOUT_H_
