#include "sampling/conversation_dataset.h"

#include <utility>

#include "ATen/ops/empty.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/internal/tokens.h"

namespace keel::sampling {
namespace {

// Every document of `dataset` (at `prefix`) holds exactly one sequence.
absl::Status CheckOneSequencePerDocument(const IndexedDataset& dataset, const std::string& prefix) {
  if (dataset.num_documents() != dataset.size()) {
    return absl::DataLossError(absl::StrCat(
        prefix, ".idx: ", dataset.num_documents(), " documents of ", dataset.size(),
        " sequences; a conversation dataset holds one sequence per document (conversation)"));
  }
  for (int64_t j = 0; j <= dataset.num_documents(); ++j) {
    if (dataset.document_index(j) != j) {
      return absl::DataLossError(absl::StrCat(prefix, ".idx: document ", j, " starts at sequence ",
                                              dataset.document_index(j), ", not ", j,
                                              "; a conversation dataset holds one sequence per "
                                              "document (conversation)"));
    }
  }
  return absl::OkStatus();
}

bool IsFloat(TokenDtype dtype) {
  return dtype == TokenDtype::kFloat32 || dtype == TokenDtype::kFloat64;
}

}  // namespace

std::string ConversationDataset::LossMaskPrefix(const std::string& path_prefix) {
  return absl::StrCat(path_prefix, "_loss_mask");
}

ConversationDataset::ConversationDataset(IndexedDataset tokens, IndexedDataset loss_mask,
                                         int64_t num_learned_tokens)
    : tokens_(std::move(tokens)),
      loss_mask_(std::move(loss_mask)),
      num_learned_tokens_(num_learned_tokens) {}

absl::StatusOr<ConversationDataset> ConversationDataset::Open(const std::string& path_prefix) {
  const std::string mask_prefix = LossMaskPrefix(path_prefix);
  KEEL_ASSIGN_OR_RETURN(IndexedDataset tokens, IndexedDataset::Open(path_prefix));
  KEEL_ASSIGN_OR_RETURN(IndexedDataset mask, IndexedDataset::Open(mask_prefix));
  if (IsFloat(tokens.dtype())) {
    return absl::DataLossError(absl::StrCat(path_prefix, ".idx: tokens of dtype ",
                                            AbslUnparseFlag(tokens.dtype()),
                                            "; conversations hold integer token ids"));
  }
  if (mask.dtype() != TokenDtype::kUint8) {
    return absl::DataLossError(absl::StrCat(mask_prefix, ".idx: dtype ",
                                            AbslUnparseFlag(mask.dtype()),
                                            "; a loss mask is uint8 (0 or 1 per token)"));
  }
  KEEL_RETURN_IF_ERROR(CheckOneSequencePerDocument(tokens, path_prefix));
  if (mask.size() != tokens.size()) {
    return absl::DataLossError(absl::StrCat(mask_prefix, ".idx: ", mask.size(),
                                            " conversations, but ", path_prefix, ".idx has ",
                                            tokens.size()));
  }
  KEEL_RETURN_IF_ERROR(CheckOneSequencePerDocument(mask, mask_prefix));
  int64_t learned = 0;
  const absl::Span<const uint8_t> bytes = mask.bin_bytes();
  for (int64_t i = 0; i < tokens.size(); ++i) {
    const int64_t length = tokens.sequence_length(i);
    if (mask.sequence_length(i) != length) {
      return absl::DataLossError(absl::StrCat(mask_prefix, ".idx: conversation ", i, " has ",
                                              mask.sequence_length(i), " mask values, but ",
                                              path_prefix, ".idx gives it ", length, " tokens"));
    }
    const uint8_t* values = bytes.data() + mask.sequence_pointer(i);
    for (int64_t p = 0; p < length; ++p) {
      if (values[p] > 1) {
        return absl::DataLossError(absl::StrCat(
            mask_prefix, ".bin: conversation ", i, " holds the mask value ",
            static_cast<int>(values[p]), " at position ", p, "; a loss mask holds 0 or 1"));
      }
      learned += values[p];
    }
  }
  return ConversationDataset(std::move(tokens), std::move(mask), learned);
}

absl::StatusOr<Conversation> ConversationDataset::Get(int64_t index) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("conversation ", index, " is outside [0, ", size(), ")"));
  }
  const int64_t length = tokens_.sequence_length(index);
  Conversation conversation;
  conversation.tokens = at::empty({length}, at::kLong);
  internal::WidenTokens(tokens_.dtype(),
                        tokens_.bin_bytes().data() + tokens_.sequence_pointer(index), length,
                        conversation.tokens.data_ptr<int64_t>());
  conversation.loss_mask = at::empty({length}, at::kBool);
  const uint8_t* values = loss_mask_.bin_bytes().data() + loss_mask_.sequence_pointer(index);
  bool* out = conversation.loss_mask.data_ptr<bool>();
  for (int64_t p = 0; p < length; ++p) out[p] = values[p] != 0;
  return conversation;
}

}  // namespace keel::sampling
