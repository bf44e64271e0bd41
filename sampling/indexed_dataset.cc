#include "sampling/indexed_dataset.h"

#include <fcntl.h>

#include <cstring>
#include <utility>

#include "ATen/ops/empty.h"
#include "ATen/ops/from_blob.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/internal/index_format.h"
#include "sampling/internal/mapped_file.h"

namespace keel::sampling {
namespace {

// The LibTorch type holding a token type as is.
at::ScalarType TorchTypeOf(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return at::kByte;
    case TokenDtype::kInt8:
      return at::kChar;
    case TokenDtype::kInt16:
      return at::kShort;
    case TokenDtype::kInt32:
      return at::kInt;
    case TokenDtype::kInt64:
      return at::kLong;
    case TokenDtype::kFloat64:
      return at::kDouble;
    case TokenDtype::kFloat32:
      return at::kFloat;
    case TokenDtype::kUint16:
      return at::kUInt16;
  }
  return at::kByte;  // unreachable: Open checked the dtype code
}

}  // namespace

// ---------------------------------------------------------------------------------------
// IndexedDataset

absl::StatusOr<IndexedDataset> IndexedDataset::Open(const std::string& path_prefix,
                                                    bool multimodal) {
  absl::StatusOr<std::shared_ptr<const internal::MappedFile>> idx =
      internal::MappedFile::Open(path_prefix + ".idx");
  if (absl::IsNotFound(idx.status()) &&
      (absl::EndsWith(path_prefix, ".bin") || absl::EndsWith(path_prefix, ".idx"))) {
    return absl::NotFoundError(absl::StrCat(
        idx.status().message(), " (a dataset is named by its prefix, without .bin or .idx: \"",
        path_prefix.substr(0, path_prefix.size() - 4), "\")"));
  }
  KEEL_RETURN_IF_ERROR(idx.status());
  KEEL_ASSIGN_OR_RETURN(auto bin, internal::MappedFile::Open(path_prefix + ".bin"));
  absl::StatusOr<internal::IndexLayout> layout =
      internal::ParseIndex((*idx)->bytes(), bin->bytes().size(), multimodal);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat((*idx)->path(), ": ", layout.status().message()));
  }
  IndexedDataset dataset;
  dataset.idx_ = *std::move(idx);
  dataset.bin_ = std::move(bin);
  dataset.dtype_ = static_cast<TokenDtype>(layout->dtype_code);
  dataset.item_size_ = layout->item_size;
  dataset.sequence_count_ = layout->sequence_count;
  dataset.document_count_ = layout->document_count;
  dataset.lengths_ = layout->lengths;
  dataset.pointers_ = layout->pointers;
  dataset.documents_ = layout->documents;
  dataset.modes_ = layout->modes;
  dataset.num_tokens_ = layout->num_tokens;
  dataset.contiguous_ = layout->contiguous;
  return dataset;
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  return internal::Load<int32_t>(lengths_ + 4 * i);
}
int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  return internal::Load<int64_t>(pointers_ + 8 * i);
}
int64_t IndexedDataset::document_index(int64_t j) const {
  return internal::Load<int64_t>(documents_ + 8 * j);
}
int8_t IndexedDataset::sequence_mode(int64_t i) const { return static_cast<int8_t>(modes_[i]); }

absl::Span<const uint8_t> IndexedDataset::bin_bytes() const { return bin_->bytes(); }

at::Tensor IndexedDataset::TokensAt(int64_t byte_offset, int64_t count) const {
  uint8_t* data = bin_->mutable_data() + byte_offset;
  const at::TensorOptions options = at::TensorOptions().dtype(TorchTypeOf(dtype_));
  if (count == 0) return at::empty({0}, options);
  // The deleter owns a reference to the mapping: the tensor keeps it alive.
  return at::from_blob(
      data, {count}, [keep = bin_](void*) {}, options);
}

absl::StatusOr<at::Tensor> IndexedDataset::Get(int64_t index, int64_t offset,
                                               std::optional<int64_t> length) const {
  if (index < 0 || index >= sequence_count_) {
    return absl::OutOfRangeError(
        absl::StrCat("sequence index ", index, " is outside [0, ", sequence_count_, ")"));
  }
  const int64_t sequence_length = this->sequence_length(index);
  if (offset < 0 || offset > sequence_length) {
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is outside [0, ",
                                              sequence_length, "] for sequence ", index));
  }
  const int64_t count = length.value_or(sequence_length - offset);
  if (count < 0 || count > sequence_length - offset) {
    return absl::OutOfRangeError(absl::StrCat("length ", count, " from offset ", offset,
                                              " is outside sequence ", index, " of ",
                                              sequence_length, " tokens"));
  }
  return TokensAt(sequence_pointer(index) + offset * item_size_, count);
}

}  // namespace keel::sampling
