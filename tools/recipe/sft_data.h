// Conversations as training samples (data.format "sft", NeMo AutoModel's ChatDataset as its
// trainers batch it): sample i is conversation i of data.prefix (tools/scripts/
// hf_sft_tokenize.py's tokens and loss mask, sampling/conversation_dataset.h) in file order,
// every n-th validating. Each is shifted on its own (inputs ids[:-1], labels ids[1:], a label
// learned iff its token is masked in: AutoModel's _package_tokenized_example) and padded to the
// sequence length with labels never learned; a longer conversation is dropped or truncated, as
// data.overlong says. With packed_sequence.packed_sequence_size S, sample i is instead pack i
// of each split's conversations (sampling::PackInOrder over their shifted lengths), shifted
// conversations one after another and then padding, S tokens; the row reports their lengths.
//
//   KEEL_ASSIGN_OR_RETURN(auto sft, SftData::Open("data/chat", options, 2048, 20, {}));
//   KEEL_RETURN_IF_ERROR(sft->Fill(/*index=*/3, /*validation=*/false, row));
#ifndef KEEL_TOOLS_RECIPE_SFT_DATA_H_
#define KEEL_TOOLS_RECIPE_SFT_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "sampling/conversation_dataset.h"
#include "sampling/sequence_packing.h"
#include "tools/recipe/sample_row.h"

namespace keel::tools::recipe {

// What data.prefix holds: a token stream cut into windows, or conversations.
enum class DataFormat { kPretraining, kSft };
bool AbslParseFlag(absl::string_view text, DataFormat* out, std::string* error);
std::string AbslUnparseFlag(DataFormat format);

// What becomes of a conversation longer than data.sequence_length + 1 tokens.
enum class Overlong { kDrop, kTruncate };
bool AbslParseFlag(absl::string_view text, Overlong* out, std::string* error);
std::string AbslUnparseFlag(Overlong overlong);

// data.format and data.overlong.
struct SftDataOptions {
  // Default: kPretraining.
  DataFormat format = DataFormat::kPretraining;
  // Default: kDrop (a truncated conversation loses the end of its answer).
  Overlong overlong = Overlong::kDrop;
};

template <typename O, typename V, base::IsFieldsOf<O, SftDataOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("format", o.format);
  v("overlong", o.overlong);
}

class SftData {
 public:
  // The conversations at `prefix`, each predicting at most `sequence_length` tokens, every
  // `every_n`-th conversation (in file order; 0: none) validating, packed by `packing`. Errors:
  // as sampling::ConversationDataset::Open.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SftData>> Open(
      const std::string& prefix, const SftDataOptions& options, int64_t sequence_length,
      int64_t every_n, const sampling::PackedSequenceOptions& packing);

  // Whether samples are packs of conversations.
  bool packs() const { return packs_; }
  // The tokens of a sample: packed_sequence_size when packing, else sequence_length.
  int64_t sample_length() const { return sample_length_; }
  int64_t train_size() const { return train_.size(); }
  int64_t val_size() const { return val_.size(); }
  // Conversations in the splits' samples.
  int64_t train_conversations() const { return static_cast<int64_t>(train_.conversations.size()); }
  int64_t val_conversations() const { return static_cast<int64_t>(val_.conversations.size()); }
  // Conversations longer than sequence_length + 1 tokens: dropped, or truncated.
  int64_t overlong() const { return overlong_; }
  // Conversations that predict more tokens than a pack holds: dropped.
  int64_t unpackable() const { return unpackable_; }
  const SftDataOptions& options() const { return options_; }
  // All the conversations at the prefix, in file order.
  const sampling::ConversationDataset& conversations() const { return conversations_; }

  // The conversations of sample `index` of a split (file indices), in their order in it.
  // Requires: an index inside the split.
  std::vector<int64_t> Conversations(int64_t index, bool validation) const;

  // Sample `index` of a split into `row`. Errors: kOutOfRange for an index outside the split;
  // the dataset's.
  [[nodiscard]] absl::Status Fill(int64_t index, bool validation, const SampleRow& row) const;

 private:
  // A split's samples: sample i is conversations[starts[i]] up to conversations[starts[i + 1]].
  struct Split {
    std::vector<int64_t> conversations;
    std::vector<int64_t> starts{0};
    int64_t size() const { return static_cast<int64_t>(starts.size()) - 1; }
  };

  SftData(sampling::ConversationDataset conversations, const SftDataOptions& options,
          int64_t sequence_length, const sampling::PackedSequenceOptions& packing)
      : conversations_(std::move(conversations)),
        options_(options),
        sequence_length_(sequence_length),
        packs_(packing.packed_sequence_size > 0),
        sample_length_(packs_ ? packing.packed_sequence_size : sequence_length) {}

  // The tokens conversation `c` predicts: its length less one, cut to sequence_length.
  int64_t Predicted(int64_t c) const;
  // `conversations` as samples: packed when packing, else one each.
  void AddSamples(const std::vector<int64_t>& conversations, Split& split);

  sampling::ConversationDataset conversations_;
  SftDataOptions options_;
  int64_t sequence_length_;
  bool packs_;
  int64_t sample_length_;
  Split train_, val_;
  int64_t overlong_ = 0;
  int64_t unpackable_ = 0;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_SFT_DATA_H_
