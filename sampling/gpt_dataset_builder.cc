#include "sampling/gpt_dataset_builder.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/indexed_dataset.h"

namespace keel::sampling {
namespace {

using GptPtr = std::shared_ptr<const MegatronGptDataset>;
using SplitMatrixRow = std::optional<std::pair<double, double>>;

// Builds the GPT and blended datasets of one configuration; each prefix is opened once.
class Builder {
 public:
  Builder(const GptDatasetConfig& config, const GptBuildOptions& options)
      : config_(config), options_(options) {}

  absl::StatusOr<GptDatasetSplits> FromBlend(const SplitMatrix& matrix, const SplitSizes& sizes);
  absl::StatusOr<GptDatasetSplits> FromBlendPerSplit(const SplitSizes& sizes);

 private:
  absl::StatusOr<std::shared_ptr<const IndexedDataset>> Open(const std::string& prefix);
  // _build_megatron_dataset_splits: the GPT datasets of one prefix, per split.
  absl::StatusOr<std::array<GptPtr, 3>> BuildSplits(const std::string& prefix,
                                                    const SplitMatrix& matrix,
                                                    const SplitSizes& sizes);
  // The blend of one split over the GPT datasets of its prefixes.
  absl::StatusOr<TopLevelDataset> Blend(Split split, const std::vector<GptPtr>& datasets,
                                        const std::optional<std::vector<double>>& weights,
                                        const std::vector<SplitSizes>& targets,
                                        std::optional<int64_t> size);
  // The GPT datasets of `prefixes` for the splits of `matrix`, sized by the weights.
  absl::StatusOr<std::array<std::vector<GptPtr>, 3>> BuildBlendParts(
      const sampling::Blend& blend, const SplitMatrix& matrix, const SplitSizes& sizes,
      std::vector<SplitSizes>& targets);

  const GptDatasetConfig& config_;
  const GptBuildOptions& options_;
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened_;
};

// _get_size_per_split_per_dataset: ceil(ceil(size * weight) * (1 + surplus)) per dataset and
// split (0 for a split of no size).
std::vector<SplitSizes> SizesPerDataset(const std::vector<double>& weights, const SplitSizes& sizes,
                                        double surplus) {
  std::vector<SplitSizes> per_dataset;
  for (double weight : weights) {
    SplitSizes row;
    for (int i = 0; i < 3; ++i) {
      const double target = std::ceil(static_cast<double>(sizes[i].value_or(0)) * weight);
      row[i] = static_cast<int64_t>(std::ceil(target * (1 + surplus)));
    }
    per_dataset.push_back(row);
  }
  return per_dataset;
}

absl::StatusOr<std::shared_ptr<const IndexedDataset>> Builder::Open(const std::string& prefix) {
  auto it = opened_.find(prefix);
  if (it != opened_.end()) return it->second;
  absl::StatusOr<IndexedDataset> dataset = IndexedDataset::Open(prefix);
  if (absl::IsNotFound(dataset.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset prefix \"", prefix, "\" names no indexed dataset: ", dataset.status().message()));
  }
  KEEL_RETURN_IF_ERROR(dataset.status());
  auto shared = std::make_shared<const IndexedDataset>(*std::move(dataset));
  opened_[prefix] = shared;
  return shared;
}

absl::StatusOr<std::array<GptPtr, 3>> Builder::BuildSplits(const std::string& prefix,
                                                           const SplitMatrix& matrix,
                                                           const SplitSizes& sizes) {
  KEEL_ASSIGN_OR_RETURN(std::shared_ptr<const IndexedDataset> indexed, Open(prefix));
  const double elements = static_cast<double>(indexed->size());
  std::array<GptPtr, 3> datasets;
  for (Split split : kSplits) {
    const int i = static_cast<int>(split);
    if (!matrix[i].has_value() || !options_.splits_to_build[i]) continue;
    // Python's round(): halves to even, as nearbyint in the default rounding mode.
    const auto begin = static_cast<int64_t>(std::nearbyint(matrix[i]->first * elements));
    const auto end = static_cast<int64_t>(std::nearbyint(matrix[i]->second * elements));
    absl::StatusOr<GptPtr> dataset = MegatronGptDataset::Create(
        indexed, prefix, {begin, end}, sizes[i], split, config_, options_.cache_mode);
    KEEL_RETURN_IF_ERROR(base::Annotate(
        dataset.status(), absl::StrCat("the ", AbslUnparseFlag(split), " split of ", prefix)));
    datasets[i] = *std::move(dataset);
  }
  return datasets;
}

absl::StatusOr<std::array<std::vector<GptPtr>, 3>> Builder::BuildBlendParts(
    const sampling::Blend& blend, const SplitMatrix& matrix, const SplitSizes& sizes,
    std::vector<SplitSizes>& targets) {
  std::vector<SplitSizes> buffers(blend.prefixes.size());  // one epoch each without weights
  if (blend.weights.has_value()) {
    const std::vector<double> weights = Normalize(*blend.weights);
    targets = SizesPerDataset(weights, sizes, 0.0);
    buffers = SizesPerDataset(weights, sizes, config_.mid_level_dataset_surplus);
  }
  std::array<std::vector<GptPtr>, 3> parts;
  for (size_t d = 0; d < blend.prefixes.size(); ++d) {
    KEEL_ASSIGN_OR_RETURN(auto splits, BuildSplits(blend.prefixes[d], matrix, buffers[d]));
    for (int i = 0; i < 3; ++i) parts[i].push_back(splits[i]);
  }
  return parts;
}

absl::StatusOr<TopLevelDataset> Builder::Blend(Split split, const std::vector<GptPtr>& datasets,
                                               const std::optional<std::vector<double>>& weights,
                                               const std::vector<SplitSizes>& targets,
                                               std::optional<int64_t> size) {
  const int i = static_cast<int>(split);
  std::vector<double> blend_weights;
  std::optional<int64_t> blend_size;
  if (weights.has_value()) {
    blend_weights = Normalize(*weights);
    blend_size = 0;
    for (const SplitSizes& target : targets) *blend_size += target[i].value_or(0);
  } else {
    int64_t total = 0;
    for (const GptPtr& dataset : datasets) {
      blend_weights.push_back(static_cast<double>(dataset->size()));
      total += dataset->size();
    }
    if (size.has_value()) blend_size = std::min(*size, total);
  }
  KEEL_ASSIGN_OR_RETURN(std::shared_ptr<const BlendedDataset> blend,
                        BlendedDataset::Create(datasets, std::move(blend_weights), blend_size,
                                               config_, options_.cache_mode));
  return TopLevelDataset(std::move(blend));
}

absl::StatusOr<GptDatasetSplits> Builder::FromBlend(const SplitMatrix& matrix,
                                                    const SplitSizes& sizes) {
  const sampling::Blend& blend = *config_.blend;
  GptDatasetSplits splits;
  if (blend.prefixes.size() == 1 && !blend.weights.has_value()) {
    KEEL_ASSIGN_OR_RETURN(auto datasets, BuildSplits(blend.prefixes[0], matrix, sizes));
    for (int i = 0; i < 3; ++i) {
      if (datasets[i] != nullptr) splits[i] = datasets[i];
    }
    return splits;
  }
  std::vector<SplitSizes> targets;
  KEEL_ASSIGN_OR_RETURN(auto parts, BuildBlendParts(blend, matrix, sizes, targets));
  for (Split split : kSplits) {
    const int i = static_cast<int>(split);
    if (!matrix[i].has_value() || !options_.splits_to_build[i]) continue;
    KEEL_ASSIGN_OR_RETURN(splits[i], Blend(split, parts[i], blend.weights, targets, sizes[i]));
  }
  return splits;
}

absl::StatusOr<GptDatasetSplits> Builder::FromBlendPerSplit(const SplitSizes& sizes) {
  GptDatasetSplits splits;
  for (Split split : kSplits) {
    const int i = static_cast<int>(split);
    const std::optional<sampling::Blend>& blend = (*config_.blend_per_split)[i];
    if (!blend.has_value() || !options_.splits_to_build[i]) continue;
    SplitMatrix whole;
    whole[i] = std::pair{0.0, 1.0};
    SplitSizes spoof = {0, 0, 0};
    spoof[i] = sizes[i];
    if (blend->prefixes.size() == 1) {
      KEEL_ASSIGN_OR_RETURN(auto datasets, BuildSplits(blend->prefixes[0], whole, spoof));
      splits[i] = datasets[i];
      continue;
    }
    std::vector<SplitSizes> targets;
    if (config_.multiple_validation_sets.value_or(false) && split == Split::kValid) {
      if (config_.full_validation.value_or(false) && sizes[i].has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "full_validation builds one epoch of each validation set; the valid size must be "
            "unset, not ",
            *sizes[i]));
      }
      std::vector<GptPtr> sets;
      for (const std::string& prefix : blend->prefixes) {
        KEEL_ASSIGN_OR_RETURN(auto datasets, BuildSplits(prefix, whole, spoof));
        sets.push_back(datasets[i]);
      }
      splits[i] = std::move(sets);
      continue;
    }
    KEEL_ASSIGN_OR_RETURN(auto parts, BuildBlendParts(*blend, whole, spoof, targets));
    KEEL_ASSIGN_OR_RETURN(splits[i], Blend(split, parts[i], blend->weights, targets, sizes[i]));
  }
  return splits;
}

// The builder's check: a split without a size may not have weights.
absl::Status CheckSizes(const GptDatasetConfig& config, const SplitSizes& sizes) {
  for (Split split : kSplits) {
    const int i = static_cast<int>(split);
    if (sizes[i].has_value() && *sizes[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", AbslUnparseFlag(split), " size (", *sizes[i], ") must be >= 0"));
    }
    const std::optional<sampling::Blend>& blend =
        config.blend_per_split.has_value() && !config.blend.has_value()
            ? (*config.blend_per_split)[i]
            : config.blend;
    if (!sizes[i].has_value() && blend.has_value() && blend->weights.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", AbslUnparseFlag(split),
                       " split has weights but no size: weighted blends need a number of samples"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GptDatasetSplits> BuildGptDatasets(const GptDatasetConfig& config,
                                                  const SplitSizes& sizes,
                                                  const GptBuildOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::optional<SplitMatrix> matrix, ValidateGptDatasetConfig(config));
  KEEL_RETURN_IF_ERROR(CheckSizes(config, sizes));
  Builder builder(config, options);
  if (matrix.has_value()) return builder.FromBlend(*matrix, sizes);
  return builder.FromBlendPerSplit(sizes);
}

absl::StatusOr<GptSplitView> GptSplitView::Of(const std::optional<TopLevelDataset>& split) {
  GptSplitView view;
  if (split.has_value()) {
    if (const auto* gpt = std::get_if<GptPtr>(&*split)) {
      view.datasets_ = {*gpt};
      return view;
    }
    if (const auto* blend = std::get_if<std::shared_ptr<const BlendedDataset>>(&*split)) {
      view.blend_ = *blend;
      view.datasets_ = (*blend)->datasets();
      return view;
    }
  }
  return absl::InvalidArgumentError(split.has_value()
                                        ? "a list of validation sets is not one sequence of samples"
                                        : "the split has no dataset (no documents, or not built)");
}

int64_t GptSplitView::size() const {
  return blend_ != nullptr ? blend_->size() : datasets_[0]->size();
}

absl::StatusOr<GptSampleRef> GptSplitView::Locate(int64_t position) const {
  if (position < 0 || position >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("position ", position, " is outside [0, ", size(), ")"));
  }
  if (blend_ == nullptr) return GptSampleRef{0, position};
  return GptSampleRef{blend_->dataset_index(position), blend_->dataset_sample_index(position)};
}

}  // namespace keel::sampling
