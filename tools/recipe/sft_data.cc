#include "tools/recipe/sft_data.h"

#include <algorithm>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"

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

absl::StatusOr<std::unique_ptr<SftData>> SftData::Open(const std::string& prefix,
                                                       const SftDataOptions& options,
                                                       int64_t sequence_length, int64_t every_n) {
  KEEL_ASSIGN_OR_RETURN(sampling::ConversationDataset conversations,
                        sampling::ConversationDataset::Open(prefix));
  std::unique_ptr<SftData> data(new SftData(std::move(conversations), options, sequence_length));
  for (int64_t c = 0; c < data->conversations_.size(); ++c) {
    if (data->conversations_.length(c) > sequence_length + 1) {
      ++data->overlong_;
      if (options.overlong == Overlong::kDrop) continue;
    }
    const bool validation = every_n > 0 && (c + 1) % every_n == 0;
    (validation ? data->val_ : data->train_).push_back(c);
  }
  return data;
}

absl::Status SftData::Fill(int64_t index, bool validation, const SampleRow& row) const {
  const std::vector<int64_t>& split = validation ? val_ : train_;
  if (index < 0 || index >= static_cast<int64_t>(split.size())) {
    return absl::OutOfRangeError(absl::StrCat("sample ", index, " of the ",
                                              validation ? "validation" : "training", " split's ",
                                              split.size(), " conversations"));
  }
  KEEL_ASSIGN_OR_RETURN(const sampling::Conversation conversation,
                        conversations_.Get(split[index]));
  const int64_t L = sequence_length_;
  // The shift within the conversation: label j is token j + 1, learned iff that token is.
  const int64_t n = std::min<int64_t>(conversation.tokens.size(0), L + 1) - 1;
  const int64_t* tokens = conversation.tokens.data_ptr<int64_t>();
  const bool* mask = conversation.loss_mask.data_ptr<bool>();
  for (int64_t j = 0; j < L; ++j) {
    const bool real = j < n;
    row.tokens[j] = real ? tokens[j] : 0;
    row.labels[j] = real ? tokens[j + 1] : 0;
    row.loss_mask[j] = real && mask[j + 1] ? 1.0f : 0.0f;
  }
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
