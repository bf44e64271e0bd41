// A checkpoint directory as a SavedState: the manifest's tensors and values (once or per
// rank), with chunk bytes read by pread (segments in parallel) and checked against their
// XXH3-64 checksums.
#ifndef KEEL_CHECKPOINT_INTERNAL_DISK_STATE_H_
#define KEEL_CHECKPOINT_INTERNAL_DISK_STATE_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/files.h"
#include "checkpoint/internal/saved_state.h"
#include "checkpoint/manifest.pb.h"

namespace keel::checkpoint::internal {

class DiskSavedState : public SavedState {
 public:
  // The checkpoint at `path`, loaded by rank `loading_rank` of `loading_world_size`.
  // Errors: as ReadManifest; kDataLoss for values the manifest cannot hold.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DiskSavedState>> Open(
      const std::string& path, int loading_rank = 0, int loading_world_size = 1);

  const Manifest& manifest() const { return manifest_; }

  // Errors: kDataLoss naming the file and tensor for a missing, truncated or corrupt chunk.
  [[nodiscard]] absl::Status ReadChunk(const std::string& key, const SavedChunk& chunk,
                                       void* out) const override;

 private:
  struct ChunkLocation {
    uint32_t file = 0;
    uint64_t byte_offset = 0;
    uint64_t byte_length = 0;
    uint64_t xxh3 = 0;
    std::vector<int64_t> offsets;
  };

  DiskSavedState(std::string path, Manifest manifest);
  absl::Status Index();
  // The open shard file `file` (opened on first use).
  absl::StatusOr<int> FileDescriptor(uint32_t file, const std::string& key) const;

  std::string path_;
  Manifest manifest_;
  std::vector<ChunkLocation> locations_;
  mutable std::mutex fds_mutex_;
  mutable std::vector<base::UniqueFd> fds_;
};

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_DISK_STATE_H_
