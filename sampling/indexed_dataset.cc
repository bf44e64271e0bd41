#include "sampling/indexed_dataset.h"

#include <fcntl.h>

#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "ATen/ops/empty.h"
#include "ATen/ops/from_blob.h"
#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "sampling/internal/index_format.h"
#include "sampling/internal/mapped_file.h"

namespace keel::sampling {
namespace {

constexpr base::EnumSpelling<TokenDtype> kTokenDtypes[] = {
    {TokenDtype::kUint8, "uint8"},     {TokenDtype::kInt8, "int8"},
    {TokenDtype::kInt16, "int16"},     {TokenDtype::kInt32, "int32"},
    {TokenDtype::kInt64, "int64"},     {TokenDtype::kFloat64, "float64"},
    {TokenDtype::kFloat32, "float32"}, {TokenDtype::kUint16, "uint16"},
};

// The LibTorch type holding a token type as is; nullopt for uint16 (none in LibTorch 1.13).
std::optional<at::ScalarType> TorchTypeOf(TokenDtype dtype) {
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
      return std::nullopt;
  }
  return std::nullopt;
}

// Stores `token` as a T at `out`, or fails if T cannot hold it exactly.
template <typename T>
bool Store(int64_t token, uint8_t* out) {
  if constexpr (std::is_integral_v<T>) {
    if (token < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (sizeof(T) < 8 && token > static_cast<int64_t>(std::numeric_limits<T>::max()))) {
      return false;
    }
  } else {
    // Integers of magnitude up to 2^53 convert to and from double without UB; float then
    // needs the round trip to be exact too.
    constexpr int64_t kExact = int64_t{1} << 53;
    if (token > kExact || token < -kExact || static_cast<int64_t>(static_cast<T>(token)) != token) {
      return false;
    }
  }
  const T value = static_cast<T>(token);
  std::memcpy(out, &value, sizeof(T));
  return true;
}

bool StoreToken(TokenDtype dtype, int64_t token, uint8_t* out) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return Store<uint8_t>(token, out);
    case TokenDtype::kInt8:
      return Store<int8_t>(token, out);
    case TokenDtype::kInt16:
      return Store<int16_t>(token, out);
    case TokenDtype::kInt32:
      return Store<int32_t>(token, out);
    case TokenDtype::kInt64:
      return Store<int64_t>(token, out);
    case TokenDtype::kFloat64:
      return Store<double>(token, out);
    case TokenDtype::kFloat32:
      return Store<float>(token, out);
    case TokenDtype::kUint16:
      return Store<uint16_t>(token, out);
  }
  return false;
}

// Token bytes gather in memory and go to the .bin in pieces of this size.
constexpr size_t kWriteBuffer = size_t{4} << 20;

}  // namespace

bool AbslParseFlag(absl::string_view text, TokenDtype* out, std::string* error) {
  return base::ParseEnum(kTokenDtypes, text, out, error);
}
std::string AbslUnparseFlag(TokenDtype dtype) {
  return std::string(base::EnumName(kTokenDtypes, dtype));
}

int64_t TokenDtypeSize(TokenDtype dtype) {
  return internal::ItemSizeOfCode(static_cast<uint8_t>(dtype));
}

TokenDtype OptimalTokenDtype(std::optional<int64_t> cardinality) {
  return cardinality.has_value() && *cardinality < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32;
}

// ---------------------------------------------------------------------------------------
// IndexedDataset

absl::StatusOr<IndexedDataset> IndexedDataset::Open(const std::string& path_prefix,
                                                    bool multimodal) {
  KEEL_ASSIGN_OR_RETURN(auto idx, internal::MappedFile::Open(path_prefix + ".idx"));
  KEEL_ASSIGN_OR_RETURN(auto bin, internal::MappedFile::Open(path_prefix + ".bin"));
  absl::StatusOr<internal::IndexLayout> layout =
      internal::ParseIndex(idx->bytes(), bin->bytes().size(), multimodal);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(idx->path(), ": ", layout.status().message()));
  }
  IndexedDataset dataset;
  dataset.idx_ = std::move(idx);
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
  if (std::optional<at::ScalarType> type = TorchTypeOf(dtype_)) {
    if (count == 0) return at::empty({0}, at::TensorOptions().dtype(*type));
    // The deleter owns a reference to the mapping: the tensor keeps it alive.
    return at::from_blob(
        data, {count}, [keep = bin_](void*) {}, at::TensorOptions().dtype(*type));
  }
  at::Tensor widened = at::empty({count}, at::TensorOptions().dtype(at::kInt));
  int32_t* out = widened.data_ptr<int32_t>();
  for (int64_t i = 0; i < count; ++i) out[i] = internal::Load<uint16_t>(data + 2 * i);
  return widened;
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

// ---------------------------------------------------------------------------------------
// IndexedDatasetWriter

IndexedDatasetWriter::IndexedDatasetWriter(std::string path_prefix, TokenDtype dtype,
                                           bool multimodal, base::UniqueFd bin)
    : path_prefix_(std::move(path_prefix)),
      dtype_(dtype),
      multimodal_(multimodal),
      bin_(std::move(bin)) {}

absl::StatusOr<IndexedDatasetWriter> IndexedDatasetWriter::Create(const std::string& path_prefix,
                                                                  TokenDtype dtype,
                                                                  bool multimodal) {
  if (TokenDtypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype code ", static_cast<int>(dtype), " is not a TokenDtype"));
  }
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd bin,
                        base::OpenFile(path_prefix + ".bin", O_WRONLY | O_CREAT | O_TRUNC));
  return IndexedDatasetWriter(path_prefix, dtype, multimodal, std::move(bin));
}

absl::Status IndexedDatasetWriter::Flush() {
  KEEL_RETURN_IF_ERROR(base::WriteAll(bin_.get(), buffer_, path_prefix_ + ".bin"));
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::AddItem(absl::Span<const int64_t> tokens, int8_t mode) {
  if (!bin_.valid()) return absl::FailedPreconditionError("AddItem after Finalize");
  if (!multimodal_ && mode != 0) {
    return absl::InvalidArgumentError(absl::StrCat("mode (", mode, ") needs a multimodal dataset"));
  }
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sequence of ", tokens.size(), " tokens does not fit the int32 length"));
  }
  const int64_t item_size = TokenDtypeSize(dtype_);
  const size_t start = buffer_.size();
  buffer_.resize(start + tokens.size() * item_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!StoreToken(dtype_, tokens[i],
                    reinterpret_cast<uint8_t*>(buffer_.data()) + start + i * item_size)) {
      buffer_.resize(start);
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", i, " (", tokens[i], ") does not fit dtype ", AbslUnparseFlag(dtype_)));
    }
  }
  if (buffer_.size() >= kWriteBuffer) KEEL_RETURN_IF_ERROR(Flush());
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  if (multimodal_) modes_.push_back(mode);
  return absl::OkStatus();
}

void IndexedDatasetWriter::EndDocument() {
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

absl::Status IndexedDatasetWriter::AddDocument(absl::Span<const int64_t> tokens,
                                               absl::Span<const int64_t> lengths) {
  int64_t total = 0;
  for (const int64_t length : lengths) {
    if (length < 0) {
      return absl::InvalidArgumentError(absl::StrCat("lengths has ", length, ": must be >= 0"));
    }
    total += length;
  }
  if (total != static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("lengths add up to ", total, " but ", tokens.size(), " tokens were given"));
  }
  size_t start = 0;
  for (const int64_t length : lengths) {
    KEEL_RETURN_IF_ERROR(AddItem(tokens.subspan(start, length)));
    start += length;
  }
  EndDocument();
  return absl::OkStatus();
}

absl::Status IndexedDatasetWriter::Finalize() {
  if (!bin_.valid()) return absl::FailedPreconditionError("Finalize called twice");
  if (document_indices_.back() != static_cast<int64_t>(lengths_.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequences ", document_indices_.back(), " to ", lengths_.size() - 1,
                     " belong to no document: call EndDocument before Finalize"));
  }
  KEEL_RETURN_IF_ERROR(Flush());
  KEEL_RETURN_IF_ERROR(bin_.Close(path_prefix_ + ".bin"));
  std::vector<int64_t> pointers;
  pointers.reserve(lengths_.size());
  int64_t pointer = 0;
  for (const int32_t length : lengths_) {
    pointers.push_back(pointer);
    pointer += length * TokenDtypeSize(dtype_);
  }
  const std::string index = internal::SerializeIndex(static_cast<uint8_t>(dtype_), lengths_,
                                                     pointers, document_indices_, modes_);
  return base::WriteFile(path_prefix_ + ".idx", index);
}

}  // namespace keel::sampling
