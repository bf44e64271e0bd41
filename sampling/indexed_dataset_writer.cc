#include "sampling/indexed_dataset_writer.h"

#include <fcntl.h>

#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "sampling/internal/index_format.h"

namespace keel::sampling {
namespace {

constexpr base::EnumSpelling<TokenDtype> kTokenDtypes[] = {
    {TokenDtype::kUint8, "uint8"},     {TokenDtype::kInt8, "int8"},
    {TokenDtype::kInt16, "int16"},     {TokenDtype::kInt32, "int32"},
    {TokenDtype::kInt64, "int64"},     {TokenDtype::kFloat64, "float64"},
    {TokenDtype::kFloat32, "float32"}, {TokenDtype::kUint16, "uint16"},
};

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
