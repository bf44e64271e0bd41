// Megatron-Core's GPTDataset (megatron/core/datasets/gpt_dataset.py), sample for sample: the
// documents [begin, end) of an indexed dataset as samples of sequence_length (+ 1) tokens cut
// across document boundaries, over as many epochs as num_samples needs, in numpy's shuffled
// orders. Its three index arrays are cached as .npy files under Megatron's names
// ("<md5 of the description>-GPTDataset-<split>-{document,sample,shuffle}_index.npy" and
// "-description.txt"), so that Keel and Megatron reuse each other's caches; they are built
// into their files through a shared mapping and read mapped, so a split of 1e8 samples costs
// no heap memory.
//
//   KEEL_ASSIGN_OR_RETURN(auto tokens, IndexedDataset::Open("/data/a"));
//   auto indexed = std::make_shared<const IndexedDataset>(std::move(tokens));
//   KEEL_ASSIGN_OR_RETURN(auto train, MegatronGptDataset::Create(indexed, "/data/a", {0, 900},
//                                                                 /*num_samples=*/1000,
//                                                                 Split::kTrain, config));
//   KEEL_RETURN_IF_ERROR(train->Sample(7, tokens, labels, loss_mask));
#ifndef KEEL_SAMPLING_MEGATRON_GPT_DATASET_H_
#define KEEL_SAMPLING_MEGATRON_GPT_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/json.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/indexed_dataset.h"
#include "sampling/internal/gpt_index.h"
#include "sampling/internal/index_array.h"

namespace keel::sampling {

// Who builds a missing index: Megatron's rank 0 builds and writes it, the other ranks load
// what rank 0 wrote.
enum class IndexCacheMode {
  // Load the cache, or build what is missing and write it.
  kBuild,
  // Load the cache; a missing one is an error (kNotFound).
  kLoadOnly,
  // Compute the sizes (len, epochs, a blend's counts) only: nothing is read, built or
  // written, and samples cannot be read (kFailedPrecondition). For plans and dry runs.
  kPlanOnly,
};

class MegatronGptDataset {
 public:
  // GPTDataset(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split,
  // config): loads the indices from the cache (config.path_to_cache, or
  // "<dataset_path>/cache/GPTDataset_indices") or builds and writes them (kBuild).
  // `num_samples` is the minimum to provide; nullopt: one epoch. Requires: `config` passed
  // ValidateGptDatasetConfig. Errors: kInvalidArgument as PlanGptIndex; kNotFound for a
  // missing cache with kLoadOnly; kDataLoss naming a cached file that does not fit the
  // configuration (Megatron's cache name leaves out add_extra_token_to_sequence and
  // drop_last_partial_validation_sequence); base::ErrnoCode's for files.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const MegatronGptDataset>> Create(
      std::shared_ptr<const IndexedDataset> indexed_dataset, std::string dataset_path,
      std::pair<int64_t, int64_t> indexed_indices, std::optional<int64_t> num_samples,
      Split index_split, const GptDatasetConfig& config,
      IndexCacheMode mode = IndexCacheMode::kBuild);

  // len(dataset): samples over all epochs.
  int64_t size() const { return plan_.size; }
  std::optional<int64_t> num_samples() const { return num_samples_; }
  Split index_split() const { return index_split_; }
  const std::string& dataset_path() const { return dataset_path_; }
  const std::shared_ptr<const IndexedDataset>& indexed_dataset() const { return dataset_; }
  std::pair<int64_t, int64_t> indexed_indices() const { return {plan_.begin, plan_.end}; }
  int64_t num_epochs() const { return plan_.num_epochs; }
  // Tokens of the split's documents, one epoch.
  int64_t tokens_per_epoch() const { return plan_.tokens_per_epoch; }
  // The ordered dict whose JSON names the cache files (and goes into a blend's description).
  const base::Json& unique_identifiers() const { return unique_identifiers_; }
  // The pad id: tokenizer.pad, or -1 when there is none or it equals tokenizer.eod.
  int64_t pad_token_id() const { return pad_token_id_; }
  int64_t sequence_length() const { return sequence_length_; }
  // Tokens a window holds: sequence_length + add_extra_token_to_sequence.
  int64_t window_size() const { return sequence_length_ + extra_; }

  // The index arrays, entry by entry. Requires: not kPlanOnly, i in range.
  int64_t document_index(int64_t i) const { return document_index_.Get(i); }
  int64_t document_index_size() const { return document_index_.size(); }
  int64_t sample_index(int64_t row, int64_t column) const {
    return sample_index_.Get(2 * row + column);
  }
  int64_t shuffle_index(int64_t i) const { return shuffle_index_.Get(i); }

  // _query_document_sample_shuffle_indices(idx): the window of sample `idx`, padded with the
  // pad id past the end of the split. `out` holds window_size() tokens. Errors: kOutOfRange
  // for idx outside [0, size()); kDataLoss for a cached index entry out of range;
  // kInvalidArgument for a token outside [0, tokenizer.vocab_size); kFailedPrecondition for
  // a kPlanOnly dataset.
  [[nodiscard]] absl::Status Window(int64_t idx, absl::Span<int64_t> out) const;

  // __getitem__(idx): tokens, labels (the next tokens; without the extra token the last
  // label is the pad id) and the loss mask, each sequence_length long. Pad ids become 0 in
  // tokens and labels and get loss mask 0, as do positions whose token (not label) is
  // tokenizer.eod with eod_mask_loss, as Megatron masks them. Each sample's mask is its own (upstream's cache hands later samples the
  // first one's pad positions). Errors: as Window.
  [[nodiscard]] absl::Status Sample(int64_t idx, absl::Span<int64_t> tokens,
                                    absl::Span<int64_t> labels, absl::Span<float> loss_mask) const;

 private:
  MegatronGptDataset() = default;

  absl::Status LoadOrBuild(const std::string& cache_dir, const GptDatasetConfig& config,
                           IndexCacheMode mode);
  absl::Status Build(const std::string& cache_dir, const std::string& base,
                     const std::string& description, int64_t random_seed);
  absl::Status Load(const std::string& base);
  // Copies `length` tokens of sequence `sequence` from `offset` to `out`.
  absl::Status CopyTokens(int64_t sequence, int64_t offset, int64_t length, int64_t* out) const;

  std::shared_ptr<const IndexedDataset> dataset_;
  std::string dataset_path_;
  std::optional<int64_t> num_samples_;
  Split index_split_ = Split::kTrain;
  int64_t sequence_length_ = 0;
  int64_t extra_ = 1;
  int64_t pad_token_id_ = -1;
  std::optional<int64_t> eod_mask_token_;
  std::optional<int64_t> vocab_size_;
  base::Json unique_identifiers_;
  bool planned_only_ = false;
  internal::GptIndexPlan plan_;
  internal::GptIndexParams params_;
  internal::IndexArray document_index_ = internal::IndexArray::InMemory({}, {0});
  internal::IndexArray sample_index_ = internal::IndexArray::InMemory({}, {0});
  internal::IndexArray shuffle_index_ = internal::IndexArray::InMemory({}, {0});
};

// The directory of a dataset's index cache: config.path_to_cache, or Megatron's default
// beside the dataset, "<dataset_path>/cache/<class_name>_indices" (empty for a blend).
std::string IndexCacheDirectory(const GptDatasetConfig& config, const std::string& dataset_path,
                                const std::string& class_name);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_MEGATRON_GPT_DATASET_H_
