// The layout of Megatron's "MMIDIDX" index (<prefix>.idx, megatron/core/datasets/
// indexed_dataset.py: _IndexWriter and _IndexReader): parsing with full validation, and
// serializing. Only the reader, the writer and the index fuzzer use it.
//
//   offset      size  field
//   0           9     magic "MMIDIDX\0\0"
//   9           8     uint64 version = 1
//   17          1     uint8 dtype code of the .bin tokens (TokenDtype)
//   18          8     uint64 N, the sequence count
//   26          8     uint64 D, the document-index count (documents + 1)
//   34          4N    int32 sequence lengths, in tokens
//   34+4N       8N    int64 sequence pointers, byte offsets into .bin
//   34+12N      8D    int64 document indices: sequence boundaries, 0 first, N last
//   34+12N+8D   N     int8 sequence modes, multimodal datasets only
// All little-endian and unaligned.
#ifndef KEEL_SAMPLING_INTERNAL_INDEX_FORMAT_H_
#define KEEL_SAMPLING_INTERNAL_INDEX_FORMAT_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace keel::sampling::internal {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the index format is little-endian");

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderSize = 34;

// Bytes per token for a dtype code, or 0 for an unknown code.
int64_t ItemSizeOfCode(uint8_t code);

// A validated index: where its arrays are (inside the parsed bytes) and what they add up to.
struct IndexLayout {
  uint8_t dtype_code = 0;
  int64_t item_size = 0;
  int64_t sequence_count = 0;
  int64_t document_count = 0;  // entries of the document index: documents + 1
  const uint8_t* lengths = nullptr;
  const uint8_t* pointers = nullptr;
  const uint8_t* documents = nullptr;
  const uint8_t* modes = nullptr;  // multimodal only
  int64_t num_tokens = 0;          // sum of the sequence lengths
  // The sequences lie back to back from byte 0 of .bin, as Megatron writes them.
  bool contiguous = true;
};

// Reads a T stored at `p` (unaligned, little-endian).
template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Checks `index` completely against a .bin of `bin_size` bytes: the magic, version 1, a known
// dtype code, a size of exactly 34 + 12N + 8D (+ N if `multimodal`), non-negative lengths,
// pointers that are multiples of the item size, non-decreasing without overlap and inside
// .bin, and document indices that start at 0, never decrease and end at N. O(N + D).
// Errors: kDataLoss saying which field is wrong, with its value and what is allowed.
[[nodiscard]] absl::StatusOr<IndexLayout> ParseIndex(absl::Span<const uint8_t> index,
                                                     uint64_t bin_size, bool multimodal);

// The bytes of an index, as Megatron's _IndexWriter writes them; `modes` is empty unless the
// dataset is multimodal. Requires: lengths and pointers (and non-empty modes) have one entry
// per sequence.
std::string SerializeIndex(uint8_t dtype_code, absl::Span<const int32_t> lengths,
                           absl::Span<const int64_t> pointers,
                           absl::Span<const int64_t> document_indices,
                           absl::Span<const int8_t> modes);

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_INDEX_FORMAT_H_
