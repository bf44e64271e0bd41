// Writing Megatron's indexed token datasets (<prefix>.bin and <prefix>.idx, as
// megatron/core/datasets/indexed_dataset.py's IndexedDatasetBuilder writes them) and their
// token types, without LibTorch: tools that link libraries embedding their own protobuf (such
// as SentencePiece) can write datasets. indexed_dataset.h reads them.
//
//   KEEL_ASSIGN_OR_RETURN(auto writer, IndexedDatasetWriter::Create("data/x",
//   TokenDtype::kUint16)); KEEL_RETURN_IF_ERROR(writer.AddDocument(tokens, lengths));
//   KEEL_RETURN_IF_ERROR(writer.Finalize());
#ifndef KEEL_SAMPLING_INDEXED_DATASET_WRITER_H_
#define KEEL_SAMPLING_INDEXED_DATASET_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/files.h"

namespace keel::sampling {

// Megatron's DType: the token type of a .bin, by its code in the index. Spellings are the
// NumPy names: "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16".
enum class TokenDtype : uint8_t {
  kUint8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUint16 = 8,
};

bool AbslParseFlag(absl::string_view text, TokenDtype* out, std::string* error);
std::string AbslUnparseFlag(TokenDtype dtype);

// Bytes per token.
int64_t TokenDtypeSize(TokenDtype dtype);

// DType.optimal_dtype: uint16 for a vocabulary of fewer than 65500 tokens, else int32.
TokenDtype OptimalTokenDtype(std::optional<int64_t> cardinality);

// Megatron's IndexedDatasetBuilder, for tests and small tools: appends sequences to
// <prefix>.bin as they come and writes <prefix>.idx on Finalize. Not atomic: a failed or
// unfinished writer leaves partial files.
class IndexedDatasetWriter {
 public:
  // Creates (truncates) <path_prefix>.bin. Errors: from base::ErrnoCode's table, naming it.
  [[nodiscard]] static absl::StatusOr<IndexedDatasetWriter> Create(const std::string& path_prefix,
                                                                   TokenDtype dtype,
                                                                   bool multimodal = false);

  IndexedDatasetWriter(IndexedDatasetWriter&& other) noexcept = default;
  IndexedDatasetWriter& operator=(IndexedDatasetWriter&& other) noexcept = default;

  // add_item: appends one sequence. Errors: kInvalidArgument if a token does not fit the
  // dtype (integers must be in range; floats must be exact) or a mode is given to a dataset
  // that is not multimodal; a write error (base::ErrnoCode's table); kFailedPrecondition
  // after Finalize.
  [[nodiscard]] absl::Status AddItem(absl::Span<const int64_t> tokens, int8_t mode = 0);

  // end_document: the sequences added since the last call form one document.
  void EndDocument();

  // add_document: appends one sequence per entry of `lengths` (which must add up to
  // tokens.size()) and ends the document. Errors: as AddItem, and kInvalidArgument for
  // lengths that do not add up.
  [[nodiscard]] absl::Status AddDocument(absl::Span<const int64_t> tokens,
                                         absl::Span<const int64_t> lengths);

  // Closes the .bin and writes <path_prefix>.idx. Errors: kFailedPrecondition if called
  // twice, or if sequences were added after the last EndDocument (Megatron writes that
  // index, and its reader then rejects it); a write error (base::ErrnoCode's table).
  [[nodiscard]] absl::Status Finalize();

 private:
  IndexedDatasetWriter(std::string path_prefix, TokenDtype dtype, bool multimodal,
                       base::UniqueFd bin);
  // Writes the buffered token bytes to the .bin.
  absl::Status Flush();

  std::string path_prefix_;
  TokenDtype dtype_;
  bool multimodal_;
  base::UniqueFd bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_ = {0};
  std::vector<int8_t> modes_;
  // Token bytes not yet written.
  std::string buffer_;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_INDEXED_DATASET_WRITER_H_
