// How a parameter's gradient is laid out across process groups, for the code that must
// reason about layouts (clipping, checkpointing). LibTorch has no DTensor: this is the small
// explicit stand-in, attached to parameters by name.
//
//   keel::gradients::ShardingSpec spec;
//   spec.Set("layers.0.mlp.w1.weight", {{{"tp", tp_group, Placement::Shard(0)}}});
//   spec.SetIf([](const std::string& n) { return n.find("experts") != n.npos; },
//              {{{"ep", ep_group, Placement::Shard(0)}}});
#ifndef KEEL_GRADIENTS_SHARDING_H_
#define KEEL_GRADIENTS_SHARDING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::gradients {

// A gradient's placement along one parallel dimension (DTensor's Replicate, Shard, Partial).
struct Placement {
  enum class Kind { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  // The tensor dimension split across the group, for kShard.
  int64_t dim = 0;

  static Placement Replicate() { return {Kind::kReplicate, 0}; }
  static Placement Shard(int64_t dim) { return {Kind::kShard, dim}; }
  // Each rank holds a partial sum; the full gradient is the sum over the group.
  static Placement Partial() { return {Kind::kPartial, 0}; }

  friend bool operator==(const Placement& a, const Placement& b) {
    return a.kind == b.kind && (a.kind != Kind::kShard || a.dim == b.dim);
  }
  friend bool operator<(const Placement& a, const Placement& b) {
    return std::make_pair(a.kind, a.kind == Kind::kShard ? a.dim : 0) <
           std::make_pair(b.kind, b.kind == Kind::kShard ? b.dim : 0);
  }
};

// One parallel dimension (DP/FSDP, TP, PP, EP, CP...) of a gradient's layout.
struct MeshDim {
  // The dimension's name, e.g. "tp" or "ep" (expert scaling selects on it).
  std::string name;
  // The ranks along this dimension. Requires: outlives every use of the layout.
  c10d::ProcessGroup* group = nullptr;
  Placement placement;
};

// A gradient's layout: one entry per parallel dimension. Empty: an ordinary local tensor.
struct GradLayout {
  std::vector<MeshDim> dims;
};

// Layouts attached to parameters by fully qualified name, or by predicate for whole families
// (experts). Parameters with no layout are ordinary local tensors.
class ShardingSpec {
 public:
  void Set(std::string name, GradLayout layout) { by_name_[std::move(name)] = std::move(layout); }
  void SetIf(std::function<bool(const std::string&)> predicate, GradLayout layout) {
    by_predicate_.emplace_back(std::move(predicate), std::move(layout));
  }
  // The layout of `name`: an exact name wins over predicates, tried in the order added.
  const GradLayout* Find(const std::string& name) const {
    if (auto it = by_name_.find(name); it != by_name_.end()) return &it->second;
    for (const auto& [predicate, layout] : by_predicate_) {
      if (predicate(name)) return &layout;
    }
    return nullptr;
  }

 private:
  std::map<std::string, GradLayout> by_name_;
  std::vector<std::pair<std::function<bool(const std::string&)>, GradLayout>> by_predicate_;
};

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_SHARDING_H_
