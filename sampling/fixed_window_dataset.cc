#include "sampling/fixed_window_dataset.h"

#include <algorithm>
#include <utility>

#include "ATen/ops/empty.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sampling/internal/tokens.h"

namespace keel::sampling {

using internal::WidenTokens;

int64_t FixedWindowDataset::SizeOf(int64_t num_tokens, const FixedWindowDatasetOptions& options) {
  const int64_t extra = options.add_extra_token_to_sequence ? 1 : 0;
  return std::max<int64_t>(0, num_tokens - extra) / options.sequence_length;
}

FixedWindowDataset::FixedWindowDataset(IndexedDataset dataset,
                                       const FixedWindowDatasetOptions& options)
    : dataset_(std::move(dataset)), options_(options) {
  size_ = SizeOf(dataset_.num_tokens(), options_);
  if (!dataset_.contiguous()) {
    sequence_starts_.reserve(dataset_.size() + 1);
    int64_t start = 0;
    for (int64_t i = 0; i < dataset_.size(); ++i) {
      sequence_starts_.push_back(start);
      start += dataset_.sequence_length(i);
    }
    sequence_starts_.push_back(start);
  }
}

absl::StatusOr<FixedWindowDataset> FixedWindowDataset::Create(
    IndexedDataset dataset, const FixedWindowDatasetOptions& options) {
  if (options.sequence_length <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence_length (", options.sequence_length, ") must be > 1"));
  }
  if (dataset.num_tokens() <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the dataset has ", dataset.num_tokens(), " tokens: GPT samples need > 1"));
  }
  if (dataset.dtype() == TokenDtype::kFloat32 || dataset.dtype() == TokenDtype::kFloat64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset's tokens are ", AbslUnparseFlag(dataset.dtype()), ": GPT needs integers"));
  }
  return FixedWindowDataset(std::move(dataset), options);
}

void FixedWindowDataset::CopyTokens(int64_t start, int64_t count, int64_t* out) const {
  const int64_t item_size = TokenDtypeSize(dataset_.dtype());
  const uint8_t* bin = dataset_.bin_bytes().data();
  if (sequence_starts_.empty()) {  // contiguous: token k is at byte k·item_size
    WidenTokens(dataset_.dtype(), bin + start * item_size, count, out);
    return;
  }
  // The last sequence starting at or before `start` (later empty ones start there too).
  int64_t i = std::upper_bound(sequence_starts_.begin(), sequence_starts_.end() - 1, start) -
              sequence_starts_.begin() - 1;
  int64_t offset = start - sequence_starts_[i];
  while (count > 0) {
    const int64_t take = std::min(count, dataset_.sequence_length(i) - offset);
    WidenTokens(dataset_.dtype(), bin + dataset_.sequence_pointer(i) + offset * item_size, take,
                out);
    out += take;
    count -= take;
    ++i;
    offset = 0;
  }
}

absl::StatusOr<at::Tensor> FixedWindowDataset::Sample(int64_t index) const {
  if (index < 0 || index >= size_) {
    return absl::OutOfRangeError(
        absl::StrCat("sample index ", index, " is outside [0, ", size_, ")"));
  }
  const int64_t count = options_.sequence_length + (options_.add_extra_token_to_sequence ? 1 : 0);
  at::Tensor sample = at::empty({count}, at::TensorOptions().dtype(at::kLong));
  CopyTokens(index * options_.sequence_length, count, sample.data_ptr<int64_t>());
  return sample;
}

}  // namespace keel::sampling
