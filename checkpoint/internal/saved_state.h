// What a load reads from: saved tensors as chunks plus each object's values (once, or per
// saving rank), held in memory or described by a manifest on disk, and which rank of how many
// loads them. The matching rules (missing keys, shape and dtype checks, overlap of chunks with
// the requested block, whose values a rank gets) live once, in state_dict.cc.
#ifndef KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_
#define KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/json.h"
#include "checkpoint/state_dict.h"

namespace keel::checkpoint::internal {

// A rectangular block of a saved tensor, stored contiguously (C order of `lengths`).
struct SavedChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;
  // The source's own handle for the chunk's bytes.
  int64_t source_index = 0;
};

struct SavedTensor {
  SavedTensorInfo info;
  std::vector<SavedChunk> chunks;
};

class SavedState {
 public:
  virtual ~SavedState() = default;

  // Saved tensors by full key ("<object>/<key>").
  const std::map<std::string, SavedTensor>& tensors() const { return tensors_; }
  // Saved values by object name: one entry when every saving rank saved the same, else one
  // per saving rank, in rank order.
  const std::map<std::string, std::vector<base::Json>>& values() const { return values_; }
  // Every saving rank's values of object `name` (a single entry stands for every rank), or
  // nullopt when nothing was saved under `name`.
  std::optional<std::vector<base::Json>> ValuesOfEachRank(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    if (it->second.size() != 1) return it->second;
    return std::vector<base::Json>(saved_world_size_, it->second[0]);
  }
  // The number of ranks that saved the state.
  int saved_world_size() const { return saved_world_size_; }
  // The rank that loads, of how many ranks loading together.
  int loading_rank() const { return loading_rank_; }
  int loading_world_size() const { return loading_world_size_; }

  // Copies a chunk's bytes (chunk volume x element size) into `out`, checked against what
  // was saved. Errors: kDataLoss naming the file and tensor; kInternal for I/O failures.
  [[nodiscard]] virtual absl::Status ReadChunk(const std::string& key, const SavedChunk& chunk,
                                               void* out) const = 0;

  // Marks a tensor as consumed by a load (for the unexpected-keys list). Thread-safe.
  void MarkRead(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    read_.insert(key);
  }
  bool WasRead(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return read_.count(key) > 0;
  }
  // Forgets the marks (between a strict load's checking pass and the load itself).
  void ClearReads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    read_.clear();
  }

 protected:
  std::map<std::string, SavedTensor> tensors_;
  std::map<std::string, std::vector<base::Json>> values_;
  int saved_world_size_ = 1;
  int loading_rank_ = 0;
  int loading_world_size_ = 1;

 private:
  mutable std::mutex mutex_;
  mutable std::set<std::string> read_;
};

// Given this rank's outcome of a load pass and the keys of the checkpoint its objects left
// unread: the lowest failing rank's status if any rank failed, else the keys every loading
// rank left unread, which are the unexpected ones (a pipeline stage reads only its own layers).
// Called once per pass on every rank, whatever the pass found.
using UnreadOnEveryRank = std::function<absl::StatusOr<std::vector<std::string>>(
    const absl::Status& status, const std::vector<std::string>& unread)>;

// Runs every object's LoadStateDict against `saved`, then lists what no object read (of any
// rank, through `unread_on_every_rank`; nullptr: this rank alone).
// Errors: kInvalidArgument with the whole report when strict and the report is not clean.
[[nodiscard]] absl::StatusOr<LoadReport> LoadStatefuls(
    const Statefuls& statefuls, const SavedState& saved, const LoadOptions& options,
    const UnreadOnEveryRank& unread_on_every_rank = nullptr);

// The volume of a block (1 for a scalar).
int64_t Volume(const std::vector<int64_t>& lengths);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_
