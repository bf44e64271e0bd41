// The three index arrays of Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py
// _build_document_sample_shuffle_indices, and helpers.cpp build_sample_idx): how many epochs
// of the split's documents a number of samples needs, the shuffled document order over those
// epochs, where each sample starts (a position in that order and a token offset), and the
// shuffled sample order.
#ifndef KEEL_SAMPLING_INTERNAL_GPT_INDEX_H_
#define KEEL_SAMPLING_INTERNAL_GPT_INDEX_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sampling/indexed_dataset.h"
#include "sampling/internal/index_array.h"
#include "sampling/numpy_random.h"

namespace keel::sampling::internal {

// The sizes of a GPT dataset's indices, computed from token counts alone.
struct GptIndexPlan {
  // Documents of the split, [begin, end) of the indexed dataset.
  int64_t begin = 0;
  int64_t end = 0;
  int64_t tokens_per_epoch = 0;
  int64_t num_epochs = 1;
  // The last epoch is shuffled on its own (it contributes under 80% of an epoch's samples).
  bool separate_final_epoch = false;
  // With separate_final_epoch: the samples of the epochs before the last.
  int64_t num_samples_sans_final_epoch = 0;
  // Samples: rows of the sample index minus one; the dataset's len.
  int64_t size = 0;
  IndexDtype sample_dtype = IndexDtype::kInt32;
  IndexDtype shuffle_dtype = IndexDtype::kUint32;
};

struct GptIndexParams {
  int64_t sequence_length = 0;
  // 1 with add_extra_token_to_sequence, else 0.
  int64_t extra = 1;
  // The train and test splits drop a last partial sample; the valid split as configured.
  bool drop_last_partial_sequence = true;
};

// Errors: kInvalidArgument when the documents hold fewer than 2 tokens (Megatron loops
// forever, or aborts in build_sample_idx) or num_samples is negative.
[[nodiscard]] absl::StatusOr<GptIndexPlan> PlanGptIndex(const IndexedDataset& dataset,
                                                        int64_t begin, int64_t end,
                                                        std::optional<int64_t> num_samples,
                                                        const GptIndexParams& params);

// _build_document_index: num_epochs copies of [begin, end) shuffled with `rng` (with
// separate_final_epoch, the epochs before the last, then the last). `out` holds
// num_epochs * (end - begin) elements.
void BuildDocumentIndex(const GptIndexPlan& plan, NumpyRandomState& rng, int32_t* out);

// build_sample_idx into `out` (plan.size + 1 rows of 2, of plan.sample_dtype). Errors:
// kInvalidArgument where a padded last sample would start at offset -1 (an empty last
// document; Megatron's int32 path asserts there).
[[nodiscard]] absl::Status BuildSampleIndex(const IndexedDataset& dataset,
                                            const int32_t* document_index, const GptIndexPlan& plan,
                                            const GptIndexParams& params, const IndexArray& out);

// _build_shuffle_index into `out` (plan.size elements of plan.shuffle_dtype): [0, size)
// shuffled, or with separate_final_epoch [0, sans) and [sans, size) shuffled apart.
void BuildShuffleIndex(const GptIndexPlan& plan, NumpyRandomState& rng, const IndexArray& out);

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_GPT_INDEX_H_
