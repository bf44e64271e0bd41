// Checkpoint file I/O on top of //base:files: the XXH3-64 checksums, shard files written in
// direct-I/O blocks and hashed while copied, and chunk reads hashed while read. Errors come
// from base::ErrnoCode's table (a full disk is kResourceExhausted).
#ifndef KEEL_CHECKPOINT_INTERNAL_FILES_H_
#define KEEL_CHECKPOINT_INTERNAL_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/files.h"

namespace keel::checkpoint::internal {

// Streaming XXH3-64.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(Hasher&& other) noexcept;
  Hasher& operator=(Hasher&&) = delete;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;
  void Reset();

 private:
  void* state_;
};

uint64_t Xxh3(const void* data, size_t size);

// Chunk checksums hash 16 MiB segments separately, so segments can be read and hashed in
// parallel: the checksum is the XXH3-64 of the segments' XXH3-64 digests (uint64 LE each).
inline constexpr size_t kChecksumSegment = size_t{16} << 20;

// The chunk checksum, fed sequentially.
class SegmentHasher {
 public:
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  Hasher segment_;
  size_t in_segment_ = 0;
  std::vector<uint64_t> digests_;
};

// The chunk checksum from its segments' digests.
uint64_t CombineSegments(const std::vector<uint64_t>& digests);

// A file opened for writing (created or truncated), closed by the destructor. Bytes gather
// in an aligned block buffer, hashed piece by piece while in cache, and go to the disk in whole
// blocks with O_DIRECT where the filesystem allows it: no copy into the page cache, which costs
// more than the disk itself on the machines measured (docs/performance.md). Elsewhere (tmpfs)
// the blocks go through plain writes.
class OutputFile {
 public:
  enum class Mode { kDirectIfSupported, kBuffered };
  [[nodiscard]] static absl::StatusOr<OutputFile> Create(const std::string& path,
                                                         Mode mode = Mode::kDirectIfSupported);
  OutputFile(OutputFile&& other) noexcept = default;
  OutputFile& operator=(OutputFile&&) = delete;

  // Writes bytes that are not chunk data (headers, padding) at the current end.
  [[nodiscard]] absl::Status Write(const void* data, size_t size);
  // Writes a chunk's bytes at the current end; returns the chunk checksum.
  [[nodiscard]] absl::StatusOr<uint64_t> WriteChunk(const void* data, size_t size);
  // Writes zeros up to the next multiple of `alignment`.
  [[nodiscard]] absl::Status PadTo(uint64_t alignment);
  // Writes what is buffered, fsyncs and closes.
  [[nodiscard]] absl::Status Close();

  uint64_t size() const { return size_; }
  // The file checksum: XXH3-64 of the file with each chunk's bytes replaced by its checksum
  // (uint64 LE). With the chunk checksums it covers every byte, hashing each byte once.
  uint64_t checksum() const { return summary_.Digest(); }
  const std::string& path() const { return path_; }
  // Whether blocks go out with O_DIRECT.
  bool direct() const { return direct_; }

 private:
  struct FreeBlock {
    void operator()(char* block) const;
  };
  OutputFile(std::string path, base::UniqueFd fd, bool direct,
             std::unique_ptr<char[], FreeBlock> block);
  // Appends to the block buffer in cache-sized pieces, hashing each copied piece into `hasher`
  // (if given), and writes every block that fills.
  template <typename H>
  absl::Status Append(const void* data, size_t size, H* hasher);
  // Writes the first `length` bytes of the block buffer at offset written_.
  absl::Status WriteBlock(size_t length);

  std::string path_;
  base::UniqueFd fd_;
  bool direct_ = false;
  std::unique_ptr<char[], FreeBlock> block_;
  size_t filled_ = 0;
  // Bytes on disk: whole blocks until Close.
  uint64_t written_ = 0;
  uint64_t size_ = 0;
  Hasher summary_;
};

// base::PreadAll, hashing the bytes into `hasher` block by block while they are in cache.
// Errors: kDataLoss if the file ends first.
[[nodiscard]] absl::Status PreadHashed(int fd, const std::string& path, void* out, size_t size,
                                       uint64_t offset, Hasher& hasher);
// Reads a chunk's `size` bytes at `offset`, its segments in parallel (a thread per core);
// returns its checksum.
[[nodiscard]] absl::StatusOr<uint64_t> PreadChunk(int fd, const std::string& path, void* out,
                                                  size_t size, uint64_t offset);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_FILES_H_
