#include "parallel/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

// torch.chunk's split of each shard dimension in turn: this rank's extent, and its offsets added
// to `offsets` when given.
std::vector<int64_t> Split(const std::vector<int64_t>& global_shape,
                           const std::vector<LayoutDim>& dims, std::vector<int64_t>* offsets) {
  std::vector<int64_t> extent = global_shape;
  for (const LayoutDim& dim : dims) {
    if (dim.placement.kind != Placement::Kind::kShard) continue;
    const int64_t d = dim.placement.dim;
    const int64_t n = DimSize(dim);
    const int64_t chunk = (extent[d] + n - 1) / n;
    const int64_t begin = std::min(extent[d], DimRank(dim) * chunk);
    if (offsets != nullptr) (*offsets)[d] += begin;
    extent[d] = std::min(chunk, extent[d] - begin);
  }
  return extent;
}

}  // namespace

at::Tensor BlockOf(const at::Tensor& whole, const TensorLayout& layout,
                   at::IntArrayRef block_shape) {
  at::Tensor block = whole;
  for (int64_t d = 0; d < whole.dim(); ++d) {
    block = block.narrow(d, layout.offsets[d], block_shape[d]);
  }
  return block;
}

int DimRank(const LayoutDim& dim) { return base::GroupRank(dim.group); }

int DimSize(const LayoutDim& dim) { return base::GroupSize(dim.group); }

TensorLayout BlockLayout(std::vector<int64_t> global_shape, std::vector<int64_t> offsets) {
  TensorLayout layout;
  layout.global_shape = std::move(global_shape);
  layout.offsets = std::move(offsets);
  return layout;
}

absl::StatusOr<TensorLayout> EvenlySharded(std::vector<int64_t> global_shape,
                                           std::vector<LayoutDim> dims) {
  for (int64_t size : global_shape) {
    if (size < 0) {
      return absl::InvalidArgumentError(absl::StrCat("global shape size ", size, " is negative"));
    }
  }
  for (const LayoutDim& dim : dims) {
    const int64_t d = dim.placement.dim;
    if (dim.placement.kind == Placement::Kind::kShard &&
        (d < 0 || d >= static_cast<int64_t>(global_shape.size()))) {
      return absl::InvalidArgumentError(absl::StrCat("\"", dim.name, "\" shards dimension ", d,
                                                     " of a tensor with ", global_shape.size(),
                                                     " dimension(s)"));
    }
  }
  TensorLayout layout;
  layout.offsets.assign(global_shape.size(), 0);
  Split(global_shape, dims, &layout.offsets);
  layout.global_shape = std::move(global_shape);
  layout.dims = std::move(dims);
  return layout;
}

std::vector<int64_t> EvenShardShape(const TensorLayout& layout) {
  return Split(layout.global_shape, layout.dims, nullptr);
}

}  // namespace keel::parallel
