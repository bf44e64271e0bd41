// What a load reads from: saved tensors as chunks plus each object's values, held in memory
// or described by a manifest on disk. The matching rules (missing keys, shape and dtype checks,
// overlap of chunks with the requested block) live once, in state_dict.cc.
#ifndef KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_
#define KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_

#include <cstdint>
#include <map>
#include <mutex>
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
  // Saved values by object name.
  const std::map<std::string, base::Json>& values() const { return values_; }

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
  std::map<std::string, base::Json> values_;

 private:
  mutable std::mutex mutex_;
  mutable std::set<std::string> read_;
};

// Runs every object's LoadStateDict against `saved`, then lists what no object read.
// Errors: kInvalidArgument with the whole report when strict and the report is not clean.
[[nodiscard]] absl::StatusOr<LoadReport> LoadStatefuls(const Statefuls& statefuls,
                                                       const SavedState& saved,
                                                       const LoadOptions& options);

// The volume of a block (1 for a scalar).
int64_t Volume(const std::vector<int64_t>& lengths);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_SAVED_STATE_H_
