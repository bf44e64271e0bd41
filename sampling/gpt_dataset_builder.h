// Megatron-Core's BlendedMegatronDatasetBuilder for GPT datasets
// (megatron/core/datasets/blended_megatron_dataset_builder.py): the train, valid and test
// datasets of a configuration. With config.blend, every prefix is split by the split matrix
// (each split gets the documents [round(begin * N), round(end * N))); a single unweighted
// prefix gives GPT datasets, anything else blends, whose GPT datasets are sized by the
// weights (ceil(ceil(size * weight) * (1 + mid_level_dataset_surplus)) samples) or, without
// weights, hold one epoch and are blended by their sizes. With config.blend_per_split, each
// split's blend takes all documents of its prefixes.
//
//   SplitSizes sizes = {1000 * 512, 100 * 512, std::nullopt};
//   KEEL_ASSIGN_OR_RETURN(GptDatasetSplits splits, BuildGptDatasets(config, sizes));
//   KEEL_ASSIGN_OR_RETURN(GptSplitView train, GptSplitView::Of(splits[0]));
//   KEEL_ASSIGN_OR_RETURN(GptSampleRef ref, train.Locate(42));  // dataset, its sample
#ifndef KEEL_SAMPLING_GPT_DATASET_BUILDER_H_
#define KEEL_SAMPLING_GPT_DATASET_BUILDER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "sampling/blended_dataset.h"
#include "sampling/gpt_dataset_config.h"
#include "sampling/megatron_gpt_dataset.h"

namespace keel::sampling {

// A split's dataset: a GPTDataset, a BlendedDataset, or (multiple_validation_sets) a list of
// GPTDatasets.
using TopLevelDataset =
    std::variant<std::shared_ptr<const MegatronGptDataset>, std::shared_ptr<const BlendedDataset>,
                 std::vector<std::shared_ptr<const MegatronGptDataset>>>;
// Train, valid and test; nullopt for a split that gets no documents or is not built.
using GptDatasetSplits = std::array<std::optional<TopLevelDataset>, 3>;
// Samples per split; nullopt: one epoch (or, for a blend without weights, every sample once).
using SplitSizes = std::array<std::optional<int64_t>, 3>;

// Runtime values of a build.
struct GptBuildOptions {
  // kBuild on the rank that writes the caches, kLoadOnly on the others. Default: kBuild.
  IndexCacheMode cache_mode = IndexCacheMode::kBuild;
  // NeMo's splits_to_build: the others are not built (nullopt). Default: all three.
  std::array<bool, 3> splits_to_build = {true, true, true};
};

// BlendedMegatronDatasetBuilder(GPTDataset, sizes, is_built_on_rank, config).build().
// Errors: as ValidateGptDatasetConfig; kInvalidArgument for a split of no size with
// weights, a prefix without its .bin or .idx (naming it), a negative size, and as
// MegatronGptDataset::Create and BlendedDataset::Create.
[[nodiscard]] absl::StatusOr<GptDatasetSplits> BuildGptDatasets(
    const GptDatasetConfig& config, const SplitSizes& sizes, const GptBuildOptions& options = {});

// Where a position of a split's dataset comes from.
struct GptSampleRef {
  // The dataset among the blend's (0 for a GPTDataset) and its sample.
  int64_t dataset = 0;
  int64_t dataset_sample = 0;
};

// A GPTDataset or BlendedDataset read position by position. Copies share the datasets.
class GptSplitView {
 public:
  // Errors: kInvalidArgument for no dataset or a list of validation sets.
  [[nodiscard]] static absl::StatusOr<GptSplitView> Of(const std::optional<TopLevelDataset>& split);

  int64_t size() const;
  // The GPT datasets behind the positions (one for a GPTDataset).
  const std::vector<std::shared_ptr<const MegatronGptDataset>>& datasets() const {
    return datasets_;
  }
  // The blend (nullptr for a GPTDataset).
  const std::shared_ptr<const BlendedDataset>& blend() const { return blend_; }
  // Errors: kOutOfRange for a position outside [0, size()).
  [[nodiscard]] absl::StatusOr<GptSampleRef> Locate(int64_t position) const;

 private:
  std::vector<std::shared_ptr<const MegatronGptDataset>> datasets_;
  std::shared_ptr<const BlendedDataset> blend_;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_GPT_DATASET_BUILDER_H_
