#include "gradients/norm_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/collectives.h"
#include "base/json.h"
#include "base/status.h"
#include "xxhash.h"

namespace keel::gradients {
namespace {

using base::Json;

// One rank's gradient block of one parameter.
struct Block {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  double sum_of_squares = 0.0;
  uint64_t hash = 0;
  int rank = 0;
};

int64_t Volume(const std::vector<int64_t>& shape) {
  int64_t volume = 1;
  for (int64_t size : shape) volume *= size;
  return volume;
}

absl::StatusOr<Block> Describe(const NamedParameter& p) {
  Block block;
  block.name = p.name;
  block.shape = p.param.sizes().vec();
  block.global_shape = p.layout ? p.layout->global_shape : block.shape;
  block.offsets = p.layout ? p.layout->offsets : std::vector<int64_t>(block.shape.size(), 0);
  for (const parallel::LayoutDim& dim :
       p.layout ? p.layout->dims : std::vector<parallel::LayoutDim>()) {
    if (dim.placement.kind == parallel::Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("the gradient of '", p.name, "' is still a partial sum over \"", dim.name,
                       "\": check the norm after ClipGradNorm, which sums it"));
    }
  }
  at::Tensor grad = p.param.grad();
  if (!grad.defined()) grad = at::zeros_like(p.param);
  const at::Tensor bytes = grad.detach().contiguous().cpu();
  block.sum_of_squares = bytes.to(at::kDouble).square().sum().item<double>();
  block.hash = XXH3_64bits(bytes.data_ptr(), bytes.nbytes());
  return block;
}

std::string Encode(const std::vector<Block>& blocks) {
  Json list = Json::array();
  for (const Block& b : blocks) {
    list.push_back({{"name", b.name},
                    {"global", b.global_shape},
                    {"offsets", b.offsets},
                    {"shape", b.shape},
                    {"sumsq", base::ToJson(b.sum_of_squares)},
                    {"hash", std::to_string(b.hash)}});
  }
  return list.dump();
}

absl::Status Decode(const std::string& bytes, int rank, std::vector<Block>& blocks) {
  KEEL_ASSIGN_OR_RETURN(const Json list, base::ParseJson(bytes));
  for (const Json& item : list) {
    Block b;
    b.rank = rank;
    KEEL_RETURN_IF_ERROR(base::FromJson(item["name"], "name", b.name));
    KEEL_RETURN_IF_ERROR(base::FromJson(item["global"], "global", b.global_shape));
    KEEL_RETURN_IF_ERROR(base::FromJson(item["offsets"], "offsets", b.offsets));
    KEEL_RETURN_IF_ERROR(base::FromJson(item["shape"], "shape", b.shape));
    KEEL_RETURN_IF_ERROR(base::FromJson(item["sumsq"], "sumsq", b.sum_of_squares));
    b.hash = std::stoull(item["hash"].get<std::string>());
    blocks.push_back(std::move(b));
  }
  return absl::OkStatus();
}

// One parameter's blocks from every rank: distinct blocks counted once into `sum`; a problem
// line if two ranks hold one block with different bytes, or the blocks do not tile the tensor.
void Judge(const std::string& name, const std::vector<const Block*>& blocks, double& sum,
           std::vector<std::string>& problems) {
  using Key = std::tuple<std::vector<int64_t>, std::vector<int64_t>>;
  std::map<Key, const Block*> distinct;
  std::vector<std::string> found;
  for (const Block* b : blocks) {
    for (size_t d = 0; d < b->shape.size(); ++d) {
      if (b->offsets.size() != b->shape.size() || b->global_shape.size() != b->shape.size() ||
          b->offsets[d] < 0 || b->offsets[d] + b->shape[d] > b->global_shape[d]) {
        found.push_back(absl::StrCat("rank ", b->rank, "'s block of shape [",
                                     absl::StrJoin(b->shape, ", "), "] at [",
                                     absl::StrJoin(b->offsets, ", "), "] does not fit in [",
                                     absl::StrJoin(b->global_shape, ", "), "]"));
        break;
      }
    }
    auto [it, first] = distinct.emplace(Key{b->offsets, b->shape}, b);
    if (!first && it->second->hash != b->hash) {
      found.push_back(absl::StrCat("ranks ", it->second->rank, " and ", b->rank,
                                   " hold its block at [", absl::StrJoin(b->offsets, ", "),
                                   "] with different values (a dimension they differ along is "
                                   "missing from its layout)"));
    }
  }
  int64_t covered = 0;
  for (const auto& [key, b] : distinct) {
    sum += b->sum_of_squares;
    covered += Volume(b->shape);
  }
  const int64_t whole = Volume(blocks.front()->global_shape);
  if (covered != whole) {
    found.push_back(absl::StrCat("its distinct blocks hold ", covered, " elements of its ", whole,
                                 " (shards that overlap or leave gaps)"));
  }
  if (!found.empty()) {
    problems.push_back(absl::StrCat("'", name, "': ", absl::StrJoin(found, "; ")));
  }
}

}  // namespace

bool NormCheck::Agrees(double reported) const {
  return problems.empty() && std::abs(reported - norm) <= 1e-6 * std::max(norm, 1e-30);
}

absl::StatusOr<NormCheck> CheckGradNorm(const std::vector<NamedParameter>& parameters,
                                        c10d::ProcessGroup* group) {
  std::vector<Block> mine;
  absl::Status described;
  for (const NamedParameter& p : parameters) {
    absl::StatusOr<Block> block = Describe(p);
    if (!block.ok()) {
      described = block.status();
      break;
    }
    mine.push_back(*std::move(block));
  }
  KEEL_ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      base::ExchangeWithStatus(described, Encode(mine), group, "gradient block descriptions"));
  std::vector<Block> all;
  for (size_t rank = 0; rank < gathered.size(); ++rank) {
    KEEL_RETURN_IF_ERROR(Decode(gathered[rank], static_cast<int>(rank), all));
  }
  std::map<std::string, std::vector<const Block*>> by_name;
  for (const Block& b : all) by_name[b.name].push_back(&b);
  NormCheck check;
  double sum = 0.0;
  for (const auto& [name, blocks] : by_name) Judge(name, blocks, sum, check.problems);
  check.norm = std::sqrt(sum);
  return check;
}

}  // namespace keel::gradients
