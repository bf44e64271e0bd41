// A whole file mapped into memory, private and copy-on-write: writes through the mapping
// reach neither the file nor other mappings, so handing out writable views is safe.
#ifndef KEEL_SAMPLING_INTERNAL_MAPPED_FILE_H_
#define KEEL_SAMPLING_INTERNAL_MAPPED_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace keel::sampling::internal {

class MappedFile {
 public:
  // Maps `path`. Errors: kNotFound if it does not exist; kUnavailable if it cannot be opened,
  // examined or mapped (the message names the path and the system error).
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(
      const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The file's bytes (empty for an empty file). Requires: the file is not truncated while
  // mapped (reading a page past its end then raises SIGBUS, as for any mapping).
  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  // The same bytes, writable: writes are private to this process and lost on unmapping.
  uint8_t* mutable_data() const { return data_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  uint8_t* data_;
  size_t size_;
};

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_MAPPED_FILE_H_
