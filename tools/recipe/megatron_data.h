// The data of a run with data.paths: Megatron's GPT datasets of those prefixes, as NeMo
// AutoModel's MegatronPretraining builds them (BlendedMegatronDatasetBuilder with
// data.split, data.seed, data.sequence_length, path_to_cache data.index_mapping_dir): the
// training split holds max_steps x global_batch_size samples, the validation split
// (max_steps / val_every_steps) x global_batch_size (NeMo's num_val_samples, val_every_steps
// 1000 when unset); the test split is not built. The training split is a
// sampling::ResumableBlend, whose state checkpoints hold ("data"): a resume with other
// weights continues every dataset where it stopped.
//
//   KEEL_ASSIGN_OR_RETURN(auto data, MegatronData::Open(options, runtime, /*plan_only=*/false));
//   KEEL_RETURN_IF_ERROR(data->Fill(/*index=*/7, /*validation=*/false, sample));
#ifndef KEEL_TOOLS_RECIPE_MEGATRON_DATA_H_
#define KEEL_TOOLS_RECIPE_MEGATRON_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sampling/gpt_dataset_builder.h"
#include "sampling/resumable_blend.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"
#include "tools/recipe/sample_row.h"

namespace keel::tools::recipe {

// Where a sample comes from.
struct SampleSource {
  std::string dataset;
  // Its sample in that dataset's stream (the training split) or GPT dataset (validation).
  int64_t dataset_sample = 0;
};

// The GPTDatasetConfig that options.data gives (tokenizer: model.vocab_size, no pad, eod
// unknown; reset_position_ids, reset_attention_mask and eod_mask_loss false, as NeMo's).
// Errors: kInvalidArgument as in ReadOptions for data.paths.
[[nodiscard]] absl::StatusOr<sampling::GptDatasetConfig> MegatronConfig(
    const TrainOptions& options);

// Train, validation, test sizes (the test split unbuilt).
sampling::SplitSizes MegatronSizes(const TrainOptions& options);

class MegatronData {
 public:
  // Builds the splits: rank 0 loads or writes the index caches while the others wait for it
  // (RunOnRankZero), then they load them; with plan_only nothing is read or written and only
  // sizes are known. Rank 0 checks first that every token is below model.vocab_size (a scan
  // once per dataset, CheckTokenRange). Collective: over runtime.control_group() and the store
  // (not with plan_only). Errors (all kInvalidArgument, before anything trains): a prefix without
  // its files, a split that gets no documents but is asked for samples, one whose documents
  // hold fewer tokens than a sample, a token at or above model.vocab_size, a training split
  // smaller than max_steps x global_batch_size; those of BuildGptDatasets.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MegatronData>> Open(
      const TrainOptions& options, const TrainRuntime& runtime, bool plan_only);

  int64_t sequence_length() const { return config_.sequence_length; }
  int64_t train_size() const { return train_->size(); }
  int64_t val_size() const { return valid_.has_value() ? valid_->size() : 0; }

  // Sample `index` of a split into `row`. Not thread-safe. Errors: kOutOfRange for an index
  // outside the split (or consumed before a resume); the datasets'.
  [[nodiscard]] absl::Status Fill(int64_t index, bool validation, const SampleRow& row);
  // Where sample `index` of a split comes from, and its window of sequence_length + 1 tokens
  // (the pad id -1 past the end of the documents). Errors: as Fill.
  [[nodiscard]] absl::StatusOr<SampleSource> Window(int64_t index, bool validation,
                                                    std::vector<int64_t>& tokens);

  // The training split's state after `consumed_samples` samples, for checkpoints.
  absl::StatusOr<sampling::BlendState> State(int64_t consumed_samples) {
    return train_->State(consumed_samples);
  }
  // Continues the training split from a checkpoint's state: when the blend changed, each
  // dataset where it stopped, with a warning on `log` (rank 0) naming the change. Collective:
  // over runtime.control_group(). Errors: kFailedPrecondition for a changed blend under the
  // "cyclic" sampler (whose samples are not consumed in order); as ResumableBlend::Continue.
  [[nodiscard]] absl::Status Resume(const sampling::BlendState& saved, const TrainOptions& options,
                                    const TrainRuntime& runtime);

  // Per split: each dataset's weight, samples drawn and epochs.
  void Describe(std::ostream& out) const;

 private:
  MegatronData() = default;

  sampling::GptDatasetConfig config_;
  sampling::GptSplitView train_view_;
  std::unique_ptr<sampling::ResumableBlend> train_;
  std::optional<sampling::GptSplitView> valid_;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_MEGATRON_DATA_H_
