// One description of how a tensor (a parameter, its gradient, its optimizer state) is laid out
// over the device mesh, after PyTorch DTensor's placements (torch/distributed/tensor/
// placement_types.py) and the attributes Megatron-Core sets on parameters
// (tensor_model_parallel, partition_dim, allreduce): the whole tensor's shape, this rank's block
// of it, and per mesh dimension whether the tensor is replicated, split along one of its
// dimensions, or a partial sum. Every consumer derives what it needs from it: clipping the
// groups to reduce norms over, checkpoints the block, the distributed optimizer its shards.
//
//   // A column-parallel linear layer's weight: its rows split over tp.
//   KEEL_ASSIGN_OR_RETURN(keel::parallel::TensorLayout layout,
//                         keel::parallel::EvenlySharded({4096, 1024}, {{"tp", tp,
//                         Placement::Shard(0)}}));
//   layout.offsets;  // {tp rank x 4096 / tp size, 0}
#ifndef KEEL_PARALLEL_LAYOUT_H_
#define KEEL_PARALLEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

// A tensor's placement along one mesh dimension (DTensor's Replicate, Shard, Partial).
struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  // The tensor dimension split across the mesh dimension's ranks, for kShard.
  int64_t dim = 0;

  static Placement Replicate() { return {Kind::kReplicate, 0}; }
  static Placement Shard(int64_t dim) { return {Kind::kShard, dim}; }
  // Each rank holds a partial sum; the tensor is the sum over the mesh dimension's ranks.
  static Placement Partial() { return {Kind::kPartial, 0}; }

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::kShard || a.dim == b.dim);
  }
  friend bool operator<(const Placement& a, const Placement& b) {
    return std::make_pair(a.kind, a.kind == Kind::kShard ? a.dim : 0) <
           std::make_pair(b.kind, b.kind == Kind::kShard ? b.dim : 0);
  }
};

// One mesh dimension a tensor spans.
struct LayoutDim {
  // The dimension's name, Megatron's token where there is one ("tp", "dp", "ep", "expert_dp",
  // ...): expert gradient scaling selects on it, messages name it.
  std::string name;
  // The ranks along it; nullptr for a single rank (nothing to exchange). Requires: outlives
  // every use of the layout.
  c10d::ProcessGroup* group = nullptr;
  Placement placement;
};

// How this rank's local tensor sits in the whole tensor.
struct TensorLayout {
  // The whole tensor's shape.
  std::vector<int64_t> global_shape;
  // Where this rank's block starts in it; the block's extent is the local tensor's shape.
  std::vector<int64_t> offsets;
  // The mesh dimensions the tensor spans, outermost first; none for a tensor that is whole (or
  // a block of it that no mesh dimension describes, such as one rank's row of a per-rank
  // table).
  std::vector<LayoutDim> dims;
};

// The block of `global_shape` at `offsets`, with no mesh dimension to describe it (one rank's
// row of a per-rank table, a block a caller lays out itself).
TensorLayout BlockLayout(std::vector<int64_t> global_shape, std::vector<int64_t> offsets);

// The layout of a tensor of `global_shape` split evenly along `dims`, in order, as torch.chunk
// splits (each rank of a dimension of n ranks gets ceil(size / n) of what the outer dimensions
// left, the last ones fewer or none): the offsets come from each dimension's group rank.
// Errors: kInvalidArgument for a shard dimension outside the tensor's, or a negative size.
[[nodiscard]] absl::StatusOr<TensorLayout> EvenlySharded(std::vector<int64_t> global_shape,
                                                         std::vector<LayoutDim> dims);

// The extent of this rank's block in an evenly sharded layout (EvenlySharded's split).
std::vector<int64_t> EvenShardShape(const TensorLayout& layout);

// The block of `whole` (a tensor of layout.global_shape) that starts at layout.offsets and is
// `block_shape` large: a view. Requires: the block lies inside `whole`.
at::Tensor BlockOf(const at::Tensor& whole, const TensorLayout& layout,
                   at::IntArrayRef block_shape);

// This rank's index along `dim` and the number of ranks there (0 and 1 without a group).
int DimRank(const LayoutDim& dim);
int DimSize(const LayoutDim& dim);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_LAYOUT_H_
