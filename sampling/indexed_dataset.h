// Megatron's indexed token datasets: <prefix>.bin (the tokens of every sequence, back to
// back) and <prefix>.idx (the "MMIDIDX" index), as megatron/core/datasets/indexed_dataset.py
// reads (IndexedDataset) and writes (IndexedDatasetBuilder) them. The reader maps both files,
// validates the whole index once, and hands out sequences as zero-copy tensors. The writer and
// the token types (without LibTorch) are in indexed_dataset_writer.h, included here.
//
//   KEEL_ASSIGN_OR_RETURN(auto dataset, keel::sampling::IndexedDataset::Open("data/wiki_text"));
//   KEEL_ASSIGN_OR_RETURN(at::Tensor tokens, dataset.Get(/*index=*/42));
#ifndef KEEL_SAMPLING_INDEXED_DATASET_H_
#define KEEL_SAMPLING_INDEXED_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sampling/indexed_dataset_writer.h"

namespace keel::sampling {
namespace internal {
class MappedFile;
}  // namespace internal

// A read-only view of one indexed dataset. Copies share the mappings, which stay alive as
// long as a copy or a tensor from Get() does. Thread-safe (all methods are const).
class IndexedDataset {
 public:
  // Maps <path_prefix>.idx and <path_prefix>.bin and validates the index in one pass over it
  // (Megatron checks only the magic and version): the magic, version 1, a known dtype code, a
  // file size of exactly 34 + 12N + 8D bytes (+ N with `multimodal`, which the header does
  // not record), non-negative lengths, pointers that are multiples of the token size,
  // non-decreasing, non-overlapping and inside the .bin, and document indices from 0 to N,
  // never decreasing. Errors: kNotFound if a file is missing (a prefix ending in .bin or .idx
  // is told to drop it), other failures to read or map by base::ErrnoCode's table; kDataLoss
  // naming the file and the first wrong field.
  [[nodiscard]] static absl::StatusOr<IndexedDataset> Open(const std::string& path_prefix,
                                                           bool multimodal = false);

  // Sequences in the dataset (len(dataset)).
  int64_t size() const { return sequence_count_; }
  // Documents: document_indices entries minus one.
  int64_t num_documents() const { return document_count_ - 1; }
  TokenDtype dtype() const { return dtype_; }
  bool multimodal() const { return modes_ != nullptr; }
  // Tokens in all sequences.
  int64_t num_tokens() const { return num_tokens_; }
  // Whether the sequences lie back to back from the start of the .bin in index order (as
  // Megatron writes them), so that any run of consecutive sequences is one byte range.
  bool contiguous() const { return contiguous_; }

  // The index arrays, entry by entry. Requires: 0 <= i < size(), 0 <= j <= num_documents().
  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  int64_t document_index(int64_t j) const;
  // Requires: multimodal().
  int8_t sequence_mode(int64_t i) const;

  // Megatron's get(idx, offset, length): `length` tokens (default: to the end) of sequence
  // `index` from token `offset`, as a 1-D tensor sharing the mapping (writes to it are
  // private copy-on-write pages) in the file's dtype (uint16 as at::kUInt16, which few
  // operators take beyond copies: convert with .to(at::kLong)). Errors: kOutOfRange for an
  // index, offset or length outside the sequence.
  [[nodiscard]] absl::StatusOr<at::Tensor> Get(int64_t index, int64_t offset = 0,
                                               std::optional<int64_t> length = std::nullopt) const;

  // The whole .bin, unconverted. Requires: the dataset (or a copy) outlives the span.
  absl::Span<const uint8_t> bin_bytes() const;

  // A tensor of `count` tokens starting at byte `byte_offset` of the .bin, zero-copy as in
  // Get(). Requires: the range lies inside the .bin and byte_offset is a multiple of the
  // token size.
  at::Tensor TokensAt(int64_t byte_offset, int64_t count) const;

 private:
  IndexedDataset() = default;

  std::shared_ptr<const internal::MappedFile> idx_;
  std::shared_ptr<const internal::MappedFile> bin_;
  TokenDtype dtype_ = TokenDtype::kUint8;
  int64_t item_size_ = 1;
  int64_t sequence_count_ = 0;
  int64_t document_count_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* documents_ = nullptr;
  const uint8_t* modes_ = nullptr;
  int64_t num_tokens_ = 0;
  bool contiguous_ = true;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_INDEXED_DATASET_H_
