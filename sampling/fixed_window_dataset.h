// GPT pretraining samples over an IndexedDataset: windows of sequence_length + 1 tokens cut
// from the dataset's sequences laid end to end, across sequence boundaries, as Megatron-Core's
// GPTDataset (megatron/core/datasets/gpt_dataset.py, sample index from helpers.cpp
// build_sample_idx) cuts them.
//
//   KEEL_ASSIGN_OR_RETURN(auto tokens, keel::sampling::IndexedDataset::Open(prefix));
//   keel::sampling::FixedWindowDatasetOptions options;
//   options.sequence_length = 4096;
//   KEEL_ASSIGN_OR_RETURN(auto gpt, keel::sampling::FixedWindowDataset::Create(tokens, options));
//   KEEL_ASSIGN_OR_RETURN(at::Tensor sample, gpt.Sample(i));  // int64, 4097 tokens
//   // inputs = sample.slice(0, 0, -1), labels = sample.slice(0, 1)
#ifndef KEEL_SAMPLING_FIXED_WINDOW_DATASET_H_
#define KEEL_SAMPLING_FIXED_WINDOW_DATASET_H_

#include <cstdint>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "base/fields.h"
#include "sampling/indexed_dataset.h"

namespace keel::sampling {

// The fields of GPTDatasetConfig that this subset uses, same names and defaults.
struct FixedWindowDatasetOptions {
  // Tokens per training sequence; Megatron requires more than 1. Default: 0 (must be set).
  int64_t sequence_length = 0;
  // Each sample carries one token more than sequence_length, shared with the next sample, so
  // that labels are the inputs shifted by one. Default: true.
  bool add_extra_token_to_sequence = true;
};

template <typename O, typename V, base::IsFieldsOf<O, FixedWindowDatasetOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("sequence_length", o.sequence_length);
  v("add_extra_token_to_sequence", o.add_extra_token_to_sequence);
}

// Megatron's GPTDataset in its simplest configuration, a documented subset: one epoch over
// every sequence of the dataset in file order, the training split's drop_last_partial_sequence
// = true, and samples in order. With L = sequence_length and e = add_extra_token_to_sequence,
// sample i is tokens [i·L, i·L + L + e) of the concatenated sequences, and there are
// (num_tokens - e) / L samples: exactly the windows Megatron's sample index describes when
// its document order is the file order.
//
// Not included: Megatron's per-epoch shuffles of the document order and of the samples
// (numpy RandomState(random_seed)), several epochs, train/valid/test splits, blending,
// padding, or the masks and position ids: megatron_gpt_dataset.h and gpt_dataset_builder.h
// are Megatron's GPTDataset whole. This subset serves the trainer's default corpus.
class FixedWindowDataset {
 public:
  // Errors: kInvalidArgument for sequence_length <= 1, a dataset of fewer than 2 tokens (both
  // Megatron assertions), or floating-point tokens.
  [[nodiscard]] static absl::StatusOr<FixedWindowDataset> Create(
      IndexedDataset dataset, const FixedWindowDatasetOptions& options);

  // Samples in the epoch.
  int64_t size() const { return size_; }

  // The samples `num_tokens` tokens make under `options`: (num_tokens - e) / L, at least 0.
  static int64_t SizeOf(int64_t num_tokens, const FixedWindowDatasetOptions& options);

  // Sample `index`: sequence_length + add_extra_token_to_sequence tokens as an int64 tensor
  // (Megatron's type; a fresh copy). Errors: kOutOfRange for an index outside [0, size()).
  [[nodiscard]] absl::StatusOr<at::Tensor> Sample(int64_t index) const;

  const IndexedDataset& dataset() const { return dataset_; }
  const FixedWindowDatasetOptions& options() const { return options_; }

 private:
  FixedWindowDataset(IndexedDataset dataset, const FixedWindowDatasetOptions& options);

  // Copies `count` tokens of the concatenated sequences from token `start` into `out`.
  void CopyTokens(int64_t start, int64_t count, int64_t* out) const;

  IndexedDataset dataset_;
  FixedWindowDatasetOptions options_;
  int64_t size_ = 0;
  // Token position of each sequence's start, then num_tokens; only for a dataset that is not
  // contiguous (a contiguous one maps token positions to bytes directly).
  std::vector<int64_t> sequence_starts_;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_FIXED_WINDOW_DATASET_H_
