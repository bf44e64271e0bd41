// Conversations for supervised fine-tuning, as tools/scripts/hf_sft_tokenize.py writes them:
// the token ids in the indexed dataset <prefix> (one document of one sequence per
// conversation) and the per-token loss mask in <prefix>_loss_mask, an indexed dataset of uint8
// 0/1 with the same documents and sizes (1: the token is learned, as NeMo AutoModel's
// assistant masks in nemo_automodel/components/datasets/llm/formatting_utils.py; not shifted).
// It knows no model and no tokenizer: shifting, padding and packing are its users'.
//
//   KEEL_ASSIGN_OR_RETURN(auto chats, keel::sampling::ConversationDataset::Open("data/chat"));
//   KEEL_ASSIGN_OR_RETURN(keel::sampling::Conversation c, chats.Get(/*index=*/3));
//   // c.tokens: int64 [n]; c.loss_mask: bool [n]; the label of input i is tokens[i + 1],
//   // learned iff loss_mask[i + 1].
#ifndef KEEL_SAMPLING_CONVERSATION_DATASET_H_
#define KEEL_SAMPLING_CONVERSATION_DATASET_H_

#include <cstdint>
#include <string>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "sampling/indexed_dataset.h"

namespace keel::sampling {

// One conversation: fresh tensors of the same length.
struct Conversation {
  // The token ids, int64.
  at::Tensor tokens;
  // Whether each token is learned, bool.
  at::Tensor loss_mask;
};

// The conversations of one prefix, in file order. Copies share the mappings. Thread-safe (all
// methods are const).
class ConversationDataset {
 public:
  // "<prefix>_loss_mask": where the loss mask of the conversations at `path_prefix` lies.
  static std::string LossMaskPrefix(const std::string& path_prefix);

  // Opens both datasets (IndexedDataset::Open's checks and errors) and checks that they agree,
  // reading the whole mask once. Errors: kDataLoss naming the file for tokens that are not
  // integers, a mask that is not uint8, a document that is not exactly one sequence, a different
  // number of conversations or a different length of one (naming it and both values), and a
  // mask value other than 0 or 1 (naming the conversation, the position and the value).
  [[nodiscard]] static absl::StatusOr<ConversationDataset> Open(const std::string& path_prefix);

  // Conversations in the dataset.
  int64_t size() const { return tokens_.size(); }
  // Tokens in all conversations.
  int64_t num_tokens() const { return tokens_.num_tokens(); }
  // Tokens whose mask is 1, in all conversations.
  int64_t num_learned_tokens() const { return num_learned_tokens_; }
  // Tokens in conversation `index`. Requires: 0 <= index < size().
  int64_t length(int64_t index) const { return tokens_.sequence_length(index); }

  // Conversation `index`. Errors: kOutOfRange for an index outside [0, size()).
  [[nodiscard]] absl::StatusOr<Conversation> Get(int64_t index) const;

  // The two datasets, for zero-copy readers (a packer reading runs of conversations).
  const IndexedDataset& tokens() const { return tokens_; }
  const IndexedDataset& loss_mask() const { return loss_mask_; }

 private:
  ConversationDataset(IndexedDataset tokens, IndexedDataset loss_mask, int64_t num_learned_tokens);

  IndexedDataset tokens_;
  IndexedDataset loss_mask_;
  int64_t num_learned_tokens_ = 0;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_CONVERSATION_DATASET_H_
