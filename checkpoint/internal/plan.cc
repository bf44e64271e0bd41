#include "checkpoint/internal/plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace keel::checkpoint::internal {
namespace {

using Block = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // offsets, lengths

struct Holders {
  const TensorEntry* first = nullptr;
  int first_rank = 0;
  // Each distinct block: its bytes and the ranks that hold it.
  std::map<Block, std::pair<uint64_t, std::vector<int>>> blocks;
};

std::string Dims(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

int64_t Volume(const std::vector<int64_t>& lengths) {
  int64_t volume = 1;
  for (int64_t length : lengths) volume *= length;
  return volume;
}

bool Disjoint(const Block& a, const Block& b) {
  for (size_t d = 0; d < a.first.size(); ++d) {
    if (a.first[d] + a.second[d] <= b.first[d] || b.first[d] + b.second[d] <= a.first[d]) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<std::string>>> PlanWrites(
    const std::vector<Manifest>& local_plans) {
  std::map<std::string, Holders> tensors;
  for (int rank = 0; rank < static_cast<int>(local_plans.size()); ++rank) {
    for (const TensorEntry& tensor : local_plans[rank].tensors()) {
      Holders& holders = tensors[tensor.name()];
      if (holders.first == nullptr) {
        holders.first = &tensor;
        holders.first_rank = rank;
      } else if (holders.first->dtype() != tensor.dtype() ||
                 !std::equal(holders.first->shape().begin(), holders.first->shape().end(),
                             tensor.shape().begin(), tensor.shape().end())) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", tensor.name(), "\" is ", holders.first->dtype(), " ",
                         Dims({holders.first->shape().begin(), holders.first->shape().end()}),
                         " on rank ", holders.first_rank, " but ", tensor.dtype(), " ",
                         Dims({tensor.shape().begin(), tensor.shape().end()}), " on rank ", rank));
      }
      const Chunk& chunk = tensor.chunks(0);
      // A rank's empty block of a tensor that is not empty (a shard without rows) holds
      // nothing to write.
      if (Volume({chunk.lengths().begin(), chunk.lengths().end()}) == 0 &&
          Volume({tensor.shape().begin(), tensor.shape().end()}) > 0) {
        continue;
      }
      auto& [bytes, ranks] = holders.blocks[{{chunk.offsets().begin(), chunk.offsets().end()},
                                             {chunk.lengths().begin(), chunk.lengths().end()}}];
      bytes = chunk.byte_length();
      ranks.push_back(rank);
    }
  }

  struct Work {
    uint64_t bytes;
    std::string name;
    const std::vector<int>* holders;
  };
  std::vector<Work> work;
  for (const auto& [name, holders] : tensors) {
    int64_t covered = 0;
    for (auto a = holders.blocks.begin(); a != holders.blocks.end(); ++a) {
      for (auto b = std::next(a); b != holders.blocks.end(); ++b) {
        if (!Disjoint(a->first, b->first)) {
          return absl::InvalidArgumentError(
              absl::StrCat("tensor \"", name, "\": block at ", Dims(a->first.first), " of shape ",
                           Dims(a->first.second), " (rank ", a->second.second[0],
                           ") overlaps block at ", Dims(b->first.first), " of shape ",
                           Dims(b->first.second), " (rank ", b->second.second[0], ")"));
        }
      }
      covered += Volume(a->first.second);
    }
    const int64_t volume = Volume({holders.first->shape().begin(), holders.first->shape().end()});
    if (covered != volume) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name,
                                                     "\": the ranks' blocks cover ", covered,
                                                     " of its ", volume, " elements"));
    }
    for (const auto& [block, placement] : holders.blocks) {
      work.push_back({placement.first, name, &placement.second});
    }
  }
  // Largest first; equal sizes in name order, so every rank computes the same plan.
  std::stable_sort(work.begin(), work.end(),
                   [](const Work& a, const Work& b) { return a.bytes > b.bytes; });
  std::vector<uint64_t> load(local_plans.size(), 0);
  std::vector<std::vector<std::string>> writes(local_plans.size());
  for (const Work& item : work) {
    int best = (*item.holders)[0];
    for (int rank : *item.holders) {
      if (load[rank] < load[best]) best = rank;
    }
    load[best] += item.bytes;
    writes[best].push_back(item.name);
  }
  for (auto& names : writes) std::sort(names.begin(), names.end());
  return writes;
}

absl::StatusOr<std::vector<ObjectEntry>> PlanValues(const std::vector<Manifest>& local_plans) {
  const int world = static_cast<int>(local_plans.size());
  std::map<std::string, std::vector<int>> holders;
  for (int rank = 0; rank < world; ++rank) {
    for (const ObjectEntry& object : local_plans[rank].objects()) {
      holders[object.name()].push_back(rank);
    }
  }
  for (const auto& [name, ranks] : holders) {
    if (static_cast<int>(ranks.size()) == world) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("object \"", name, "\" is saved by rank", ranks.size() > 1 ? "s " : " ",
                     absl::StrJoin(ranks, ", "), " of ", world,
                     ", not by every rank: every rank must save the same objects"));
  }
  // Every rank holds every name once, sorted (Statefuls is a map): entry i is the same object
  // on every rank.
  std::vector<ObjectEntry> objects;
  for (int i = 0; world > 0 && i < local_plans[0].objects_size(); ++i) {
    const ObjectEntry& first = local_plans[0].objects(i);
    const std::string bytes = first.value().SerializeAsString();
    bool equal = true;
    for (int rank = 1; rank < world && equal; ++rank) {
      equal = local_plans[rank].objects(i).value().SerializeAsString() == bytes;
    }
    ObjectEntry& object = objects.emplace_back();
    object.set_name(first.name());
    if (equal) {
      *object.mutable_value() = first.value();
      continue;
    }
    for (int rank = 0; rank < world; ++rank) {
      RankValue* entry = object.add_rank_values();
      entry->set_rank(rank);
      *entry->mutable_value() = local_plans[rank].objects(i).value();
    }
  }
  return objects;
}

}  // namespace keel::checkpoint::internal
