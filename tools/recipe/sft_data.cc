#include "tools/recipe/sft_data.h"

#include <algorithm>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "c10/util/Exception.h"

namespace keel::tools::recipe {
namespace {

constexpr base::EnumSpelling<DataFormat> kDataFormats[] = {
    {DataFormat::kPretraining, "pretraining"}, {DataFormat::kSft, "sft"}};
constexpr base::EnumSpelling<Overlong> kOverlongs[] = {{Overlong::kDrop, "drop"},
                                                       {Overlong::kTruncate, "truncate"}};

}  // namespace

bool AbslParseFlag(absl::string_view text, DataFormat* out, std::string* error) {
  return base::ParseEnum(kDataFormats, text, out, error);
}
std::string AbslUnparseFlag(DataFormat format) {
  return std::string(base::EnumName(kDataFormats, format));
}
bool AbslParseFlag(absl::string_view text, Overlong* out, std::string* error) {
  return base::ParseEnum(kOverlongs, text, out, error);
}
std::string AbslUnparseFlag(Overlong overlong) {
  return std::string(base::EnumName(kOverlongs, overlong));
}

absl::StatusOr<std::unique_ptr<SftData>> SftData::Open(
    const std::string& prefix, const SftDataOptions& options, int64_t sequence_length,
    int64_t every_n, const sampling::PackedSequenceOptions& packing) {
  KEEL_ASSIGN_OR_RETURN(sampling::ConversationDataset conversations,
                        sampling::ConversationDataset::Open(prefix));
  std::unique_ptr<SftData> data(
      new SftData(std::move(conversations), options, sequence_length, packing));
  std::vector<int64_t> train, val;
  for (int64_t c = 0; c < data->conversations_.size(); ++c) {
    if (data->conversations_.length(c) > sequence_length + 1) {
      ++data->overlong_;
      if (options.overlong == Overlong::kDrop) continue;
    }
    const bool validation = every_n > 0 && (c + 1) % every_n == 0;
    (validation ? val : train).push_back(c);
  }
  data->AddSamples(train, data->train_);
  data->AddSamples(val, data->val_);
  return data;
}

int64_t SftData::Predicted(int64_t c) const {
  return std::max<int64_t>(std::min(conversations_.length(c), sequence_length_ + 1) - 1, 0);
}

void SftData::AddSamples(const std::vector<int64_t>& conversations, Split& split) {
  if (!packs_) {
    for (const int64_t c : conversations) {
      split.conversations.push_back(c);
      split.starts.push_back(static_cast<int64_t>(split.conversations.size()));
    }
    return;
  }
  std::vector<int64_t> lengths;
  for (const int64_t c : conversations) lengths.push_back(Predicted(c));
  const sampling::Packs packs = sampling::PackInOrder(lengths, sample_length_);
  unpackable_ += static_cast<int64_t>(packs.dropped.size());
  for (const std::vector<int64_t>& members : packs.packs) {
    for (const int64_t i : members) split.conversations.push_back(conversations[i]);
    split.starts.push_back(static_cast<int64_t>(split.conversations.size()));
  }
}

std::vector<int64_t> SftData::Conversations(int64_t index, bool validation) const {
  const Split& split = validation ? val_ : train_;
  TORCH_INTERNAL_ASSERT(index >= 0 && index < split.size());
  return {split.conversations.begin() + split.starts[index],
          split.conversations.begin() + split.starts[index + 1]};
}

absl::Status SftData::Fill(int64_t index, bool validation, const SampleRow& row) const {
  const Split& split = validation ? val_ : train_;
  if (index < 0 || index >= split.size()) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " of the ",
                                              validation ? "validation" : "training", " split's ",
                                              split.size(), " samples"));
  }
  if (row.sequence_lengths != nullptr) row.sequence_lengths->clear();
  int64_t used = 0;
  for (const int64_t c : Conversations(index, validation)) {
    KEEL_ASSIGN_OR_RETURN(const sampling::Conversation conversation, conversations_.Get(c));
    // The shift within the conversation: label j is token j + 1, learned iff that token is.
    const int64_t n = Predicted(c);
    const int64_t* tokens = conversation.tokens.data_ptr<int64_t>();
    const bool* mask = conversation.loss_mask.data_ptr<bool>();
    for (int64_t j = 0; j < n; ++j) {
      row.tokens[used + j] = tokens[j];
      row.labels[used + j] = tokens[j + 1];
      row.loss_mask[used + j] = mask[j + 1] ? 1.0f : 0.0f;
    }
    used += n;
    if (row.sequence_lengths != nullptr) row.sequence_lengths->push_back(n);
  }
  std::fill(row.tokens + used, row.tokens + sample_length_, 0);
  std::fill(row.labels + used, row.labels + sample_length_, 0);
  std::fill(row.loss_mask + used, row.loss_mask + sample_length_, 0.0f);
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
