// Reading and writing safetensors files, byte for byte the format of huggingface/safetensors
// (README "Format"; the reader's checks follow safetensors/src/tensor.rs `read_metadata` and
// `Metadata::validate`): 8 bytes little-endian N, an N-byte JSON header padded with spaces to a
// multiple of 8, then the little-endian C-order tensor bytes, contiguous from offset 0.
//
//   KEEL_RETURN_IF_ERROR(keel::checkpoint::WriteSafetensorsFile(
//       "/ckpt/model.safetensors", {{"w", weight}, {"b", bias}}, {{"format", "pt"}}));
//   KEEL_ASSIGN_OR_RETURN(auto tensors, keel::checkpoint::ReadSafetensorsFile(path));
//   KEEL_ASSIGN_OR_RETURN(auto header, keel::checkpoint::ReadSafetensorsHeader(path));
//   for (const auto& e : header.entries) { /* e.name, e.dtype, e.shape, data_start + e.begin */ }
#ifndef KEEL_CHECKPOINT_SAFETENSORS_H_
#define KEEL_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace keel::checkpoint {

// The largest header a reader accepts, in bytes (tensor.rs `MAX_HEADER_SIZE`).
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets within the data buffer, end exclusive
  uint64_t end = 0;
};

// A parsed and validated header.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;        // sorted by begin, then end, then name
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_start = 0;                      // file offset of the data buffer: 8 + N
};

// Lays `entries` out contiguously in the given order (fills begin/end from shape and dtype)
// and returns the bytes that precede the data: N as 8 bytes LE, then the JSON header padded
// with spaces so the data starts at a multiple of 8. "__metadata__" comes first when
// `metadata` is not empty. Errors: kInvalidArgument for an unsupported dtype, a negative dim,
// a shape whose size overflows, an empty or duplicate name, the name "__metadata__", or a
// name, key or value that is not UTF-8.
[[nodiscard]] absl::StatusOr<std::string> EncodeSafetensorsHeader(
    std::vector<SafetensorsEntry>& entries, const std::map<std::string, std::string>& metadata);

// Parses and validates the header of a file of `file_size` bytes that starts with `bytes`.
// Besides the reference's rules (header <= kMaxSafetensorsHeaderSize, JSON object starting
// with '{', offsets contiguous from 0 and covering the rest of the file, sizes matching
// shape x dtype), it rejects duplicate keys, fields other than dtype/shape/data_offsets, and
// shapes LibTorch cannot allocate (product of dims, 0 counted as 1, above 2^63 - 1).
// Requires: `bytes` holds the file's first 8 + N bytes (or all of it, if shorter).
// Errors: kDataLoss naming the tensor and the offending value.
[[nodiscard]] absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes,
                                                                       uint64_t file_size);

// Reads and validates the header of the file at `path`. Errors: kNotFound; kDataLoss naming
// the path; kInternal for other I/O failures.
[[nodiscard]] absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Writes a complete safetensors file durably: into "<path>.tmp", fsync, rename, fsync of the
// directory. Tensors are written in the given order from any device or layout (copied to
// contiguous CPU memory one at a time). Errors: kInvalidArgument as EncodeSafetensorsHeader,
// or for an undefined tensor; kResourceExhausted for a full disk or file-size limit; kNotFound
// for a missing directory; kInternal otherwise.
[[nodiscard]] absl::Status WriteSafetensorsFile(
    const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata);

// Reads every tensor of a file into CPU tensors, in the order of SafetensorsHeader::entries.
// Errors: kNotFound; kDataLoss for a bad header, a truncated file, or a BOOL byte other than
// 0 or 1; kResourceExhausted if a tensor cannot be allocated; kInternal for I/O failures.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadSafetensorsFile(
    const std::string& path);

// One block of the tensor `entry` of the file at `path`, whose header `header` is (as
// ReadSafetensorsHeader returned it): the elements [offsets[d], offsets[d] + shape[d]) of each
// dimension d, read as contiguous byte runs (one run for a block of whole rows, one per row of
// a block of columns), so that a tensor-parallel rank reads its slice and not the tensor.
// Errors: kInvalidArgument for a block of another rank or outside the tensor; kDataLoss when
// the file's size no longer matches the header, or for a BOOL byte other than 0 or 1; as
// ReadSafetensorsFile otherwise.
[[nodiscard]] absl::StatusOr<at::Tensor> ReadSafetensorsBlock(const std::string& path,
                                                              const SafetensorsHeader& header,
                                                              const SafetensorsEntry& entry,
                                                              const std::vector<int64_t>& offsets,
                                                              const std::vector<int64_t>& shape);

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_SAFETENSORS_H_
