// Megatron-Core's BlendedDataset (megatron/core/datasets/blended_dataset.py) and the blending
// indices of helpers.cpp (build_blending_indices, build_exhaustive_blending_indices): which
// dataset, and which of its samples, each position of a blend serves. With a size, position
// p goes to the dataset furthest below its weight's share of max(p, 1) samples; without one,
// every sample of every dataset is served once, in proportion to their sizes. Cached under
// Megatron's names ("<md5>-BlendedDataset-<split>-{dataset_index,dataset_sample_index}.npy")
// when config.path_to_cache is set, built in memory otherwise.
//
//   KEEL_ASSIGN_OR_RETURN(auto blend, BlendedDataset::Create({a, b}, {0.3, 0.7},
//                                                           /*size=*/1000, config));
//   const int64_t d = blend->dataset_index(5), j = blend->dataset_sample_index(5);
//   KEEL_RETURN_IF_ERROR(blend->datasets()[d]->Window(j, window));
#ifndef KEEL_SAMPLING_BLENDED_DATASET_H_
#define KEEL_SAMPLING_BLENDED_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/json.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/internal/index_array.h"
#include "sampling/megatron_gpt_dataset.h"

namespace keel::sampling {

// build_blending_indices, resumable: fills positions [first, first + count) of a blend, each
// going to the dataset d with the largest weights[d] * max(p, 1) - taken[d] (the lowest d on
// ties), where taken[d] counts d's positions before p (updated here); the dataset sample is
// offsets[d] + taken[d]. Megatron's is first = 0, taken and offsets 0. `dataset_index` and
// `dataset_sample_index` hold `count` entries.
void BuildBlendingIndices(absl::Span<const double> weights, int64_t first, int64_t count,
                          absl::Span<int64_t> taken, absl::Span<const int64_t> offsets,
                          int16_t* dataset_index, int64_t* dataset_sample_index);

class BlendedDataset {
 public:
  // BlendedDataset(datasets, weights, size, config): `weights` are normalized when `size` is
  // set; without a size they are the datasets' sample counts (integers) and every sample is
  // served once. With kPlanOnly nothing is built: only the per-dataset counts are computed.
  // Requires: the datasets are of one split. Errors: kInvalidArgument for no datasets,
  // 32767 or more, weights not as many or not > 0, fractional weights without a size, a
  // blend that takes more samples from a dataset than it holds (Megatron's IndexError: raise
  // mid_level_dataset_surplus); as MegatronGptDataset::Create for the cache.
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const BlendedDataset>> Create(
      std::vector<std::shared_ptr<const MegatronGptDataset>> datasets, std::vector<double> weights,
      std::optional<int64_t> size, const GptDatasetConfig& config,
      IndexCacheMode mode = IndexCacheMode::kBuild);

  // len(blend).
  int64_t size() const { return size_; }
  // The size asked for (nullopt: exhaustive).
  std::optional<int64_t> requested_size() const { return requested_size_; }
  const std::vector<double>& weights() const { return weights_; }
  const std::vector<std::shared_ptr<const MegatronGptDataset>>& datasets() const {
    return datasets_;
  }
  Split split() const { return datasets_[0]->index_split(); }
  // Positions of the blend served by each dataset.
  const std::vector<int64_t>& samples_per_dataset() const { return samples_per_dataset_; }

  // The dataset and its sample at position i. Requires: built (not kPlanOnly), 0 <= i < size().
  int64_t dataset_index(int64_t i) const { return dataset_index_.Get(i); }
  int64_t dataset_sample_index(int64_t i) const { return dataset_sample_index_.Get(i); }

 private:
  BlendedDataset() = default;

  absl::Status BuildIndices(const GptDatasetConfig& config, IndexCacheMode mode);
  void Fill(const internal::IndexArray& dataset_index,
            const internal::IndexArray& dataset_sample_index);
  // Counts the positions of each dataset; kInvalidArgument where one holds too few samples.
  absl::Status CountSamples(double surplus);

  std::vector<std::shared_ptr<const MegatronGptDataset>> datasets_;
  std::vector<double> weights_;
  std::optional<int64_t> requested_size_;
  int64_t size_ = 0;
  std::vector<int64_t> samples_per_dataset_;
  internal::IndexArray dataset_index_ = internal::IndexArray::InMemory({}, {0});
  internal::IndexArray dataset_sample_index_ = internal::IndexArray::InMemory({}, {0});
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_BLENDED_DATASET_H_
