#include "sampling/blended_dataset.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/internal/md5.h"
#include "sampling/internal/python_json.h"

// The cache of a sized blend, when config.path_to_cache is set, follows the GPT dataset's
// protocol (megatron_gpt_dataset.cc): "<md5>-BlendedDataset-<split>-" + description.txt,
// dataset_index.npy (int16) and dataset_sample_index.npy (int64), the arrays written to
// temporary names and renamed, the description last.
namespace keel::sampling {
namespace {

using base::Json;
using internal::IndexArray;
using internal::IndexDtype;

// build_exhaustive_blending_indices: every sample of every dataset once; position p goes to
// the unspent dataset with the largest share(d) * max(p, 1) - taken(d), the lowest on ties.
void BuildExhaustiveBlendingIndices(absl::Span<const double> sizes, int16_t* dataset_index,
                                    int64_t* dataset_sample_index) {
  double total = 0;
  for (double s : sizes) total += s;
  std::vector<double> shares;
  for (double s : sizes) shares.push_back(s / total);
  std::vector<int64_t> taken(sizes.size(), 0);
  std::set<size_t> unspent;
  for (size_t d = 0; d < sizes.size(); ++d) unspent.insert(d);
  for (int64_t p = 0; !unspent.empty(); ++p) {
    const double scale = std::max(static_cast<double>(p), 1.0);
    size_t best = *unspent.begin();
    double best_error = std::numeric_limits<double>::lowest();
    for (size_t d : unspent) {
      const double error = shares[d] * scale - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    dataset_index[p] = static_cast<int16_t>(best);
    dataset_sample_index[p] = taken[best]++;
    if (static_cast<double>(taken[best]) == sizes[best]) unspent.erase(best);
  }
}

absl::Status CheckWeights(const std::vector<std::shared_ptr<const MegatronGptDataset>>& datasets,
                          const std::vector<double>& weights, std::optional<int64_t> size) {
  if (datasets.empty() || datasets.size() >= 32767 || weights.size() != datasets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a blend of ", datasets.size(), " datasets and ",
                                                   weights.size(),
                                                   " weights; allowed: 1 to 32766 of each"));
  }
  for (size_t d = 0; d < datasets.size(); ++d) {
    const double w = weights[d];
    const std::string what =
        absl::StrCat("the blend weight of the ", AbslUnparseFlag(datasets[d]->index_split()),
                     " split of ", datasets[d]->dataset_path(), " (", w, ")");
    if (!(w > 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " must be finite and > 0", size.has_value() ? "" : ": it holds no sample"));
    }
    if (!size.has_value() && w != std::floor(w)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " without a size must be a whole number of samples"));
    }
  }
  return absl::OkStatus();
}

std::string CachePath(const std::string& base, absl::string_view affix) {
  return absl::StrCat(base, "-", affix);
}

absl::Status Publish(const IndexArray& array, const std::string& temporary,
                     const std::string& path) {
  KEEL_RETURN_IF_ERROR(array.Sync());
  return base::RenameDurably(temporary, path);
}

}  // namespace

void BuildBlendingIndices(absl::Span<const double> weights, int64_t first, int64_t count,
                          absl::Span<int64_t> taken, absl::Span<const int64_t> offsets,
                          int16_t* dataset_index, int64_t* dataset_sample_index) {
  for (int64_t i = 0; i < count; ++i) {
    const double scale = std::max(static_cast<double>(first + i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * scale - static_cast<double>(taken[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * scale - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    if (dataset_index != nullptr) {
      dataset_index[i] = static_cast<int16_t>(best);
      dataset_sample_index[i] = offsets[best] + taken[best];
    }
    ++taken[best];
  }
}

absl::StatusOr<std::shared_ptr<const BlendedDataset>> BlendedDataset::Create(
    std::vector<std::shared_ptr<const MegatronGptDataset>> datasets, std::vector<double> weights,
    std::optional<int64_t> size, const GptDatasetConfig& config, IndexCacheMode mode) {
  KEEL_RETURN_IF_ERROR(CheckWeights(datasets, weights, size));
  if (size.has_value() && *size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("blend size (", *size, ") must be >= 0"));
  }
  std::shared_ptr<BlendedDataset> blend(new BlendedDataset());
  blend->datasets_ = std::move(datasets);
  blend->weights_ = size.has_value() ? Normalize(weights) : std::move(weights);
  blend->requested_size_ = size;
  if (size.has_value()) {
    blend->size_ = *size;
  } else {
    for (double w : blend->weights_) blend->size_ += static_cast<int64_t>(w);
  }
  KEEL_RETURN_IF_ERROR(blend->BuildIndices(config, mode));
  KEEL_RETURN_IF_ERROR(blend->CountSamples(config.mid_level_dataset_surplus));
  return std::shared_ptr<const BlendedDataset>(std::move(blend));
}

void BlendedDataset::Fill(const IndexArray& dataset_index, const IndexArray& dataset_sample_index) {
  if (requested_size_.has_value()) {
    std::vector<int64_t> taken(datasets_.size(), 0), offsets(datasets_.size(), 0);
    BuildBlendingIndices(weights_, 0, size_, absl::MakeSpan(taken), offsets,
                         dataset_index.data<int16_t>(), dataset_sample_index.data<int64_t>());
  } else {
    BuildExhaustiveBlendingIndices(weights_, dataset_index.data<int16_t>(),
                                   dataset_sample_index.data<int64_t>());
  }
}

absl::Status BlendedDataset::BuildIndices(const GptDatasetConfig& config, IndexCacheMode mode) {
  samples_per_dataset_.assign(datasets_.size(), 0);
  if (mode == IndexCacheMode::kPlanOnly) {
    if (requested_size_.has_value()) {
      BuildBlendingIndices(weights_, 0, size_, absl::MakeSpan(samples_per_dataset_), {}, nullptr,
                           nullptr);
    } else {
      for (size_t d = 0; d < datasets_.size(); ++d) {
        samples_per_dataset_[d] = static_cast<int64_t>(weights_[d]);
      }
    }
    return absl::OkStatus();
  }
  if (!config.path_to_cache.has_value()) {
    dataset_index_ = IndexArray::InMemory(IndexDtype::kInt16, {size_});
    dataset_sample_index_ = IndexArray::InMemory(IndexDtype::kInt64, {size_});
    Fill(dataset_index_, dataset_sample_index_);
    return absl::OkStatus();
  }
  Json identifiers = {{"class", "BlendedDataset"}, {"datasets", Json::array()}};
  for (const auto& dataset : datasets_) {
    identifiers["datasets"].push_back(dataset->unique_identifiers());
  }
  identifiers["split"] = AbslUnparseFlag(split());
  identifiers["weights"] = Json::array();
  for (double w : weights_) {
    identifiers["weights"].push_back(requested_size_ ? Json(w) : Json(static_cast<int64_t>(w)));
  }
  identifiers["size"] = base::ToJson(requested_size_);
  const std::string description = internal::PythonJsonDumps(identifiers);
  const std::string base = base::JoinPath(
      *config.path_to_cache, absl::StrCat(internal::Md5Hex(description), "-BlendedDataset-",
                                          identifiers["split"].get<std::string>()));
  const std::string index_path = CachePath(base, "dataset_index.npy");
  const std::string sample_path = CachePath(base, "dataset_sample_index.npy");
  if (base::PathExists(CachePath(base, "description.txt")) && base::PathExists(index_path) &&
      base::PathExists(sample_path)) {
    KEEL_ASSIGN_OR_RETURN(dataset_index_, IndexArray::OpenNpy(index_path));
    KEEL_ASSIGN_OR_RETURN(dataset_sample_index_, IndexArray::OpenNpy(sample_path));
    if (dataset_index_.shape() != std::vector<int64_t>{size_} ||
        dataset_index_.dtype() != IndexDtype::kInt16 ||
        dataset_sample_index_.shape() != std::vector<int64_t>{size_} ||
        dataset_sample_index_.dtype() != IndexDtype::kInt64) {
      return absl::DataLossError(absl::StrCat(base, "-*.npy do not hold ", size_,
                                              " int16 and int64 entries; delete them to rebuild"));
    }
    return absl::OkStatus();
  }
  if (mode == IndexCacheMode::kLoadOnly) {
    return absl::NotFoundError(absl::StrCat("no blend index cache ", base, "-*: the rank that ",
                                            "builds it (rank 0) has not written it"));
  }
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(*config.path_to_cache));
  const std::string suffix = absl::StrCat(".", ::getpid(), ".tmp");
  KEEL_ASSIGN_OR_RETURN(dataset_index_,
                        IndexArray::CreateNpy(index_path + suffix, IndexDtype::kInt16, {size_}));
  KEEL_ASSIGN_OR_RETURN(dataset_sample_index_,
                        IndexArray::CreateNpy(sample_path + suffix, IndexDtype::kInt64, {size_}));
  Fill(dataset_index_, dataset_sample_index_);
  KEEL_RETURN_IF_ERROR(Publish(dataset_index_, index_path + suffix, index_path));
  KEEL_RETURN_IF_ERROR(Publish(dataset_sample_index_, sample_path + suffix, sample_path));
  return base::WriteFileAtomically(CachePath(base, "description.txt"), description);
}

absl::Status BlendedDataset::CountSamples(double surplus) {
  if (dataset_index_.size() == size_ && size_ > 0) {
    samples_per_dataset_.assign(datasets_.size(), 0);
    for (int64_t i = 0; i < size_; ++i) {
      const int64_t d = dataset_index_.Get(i);
      if (d < 0 || d >= static_cast<int64_t>(datasets_.size())) {
        return absl::DataLossError(absl::StrCat("blend position ", i, " names dataset ", d, " of ",
                                                datasets_.size(), "; delete the cache"));
      }
      ++samples_per_dataset_[d];
    }
  }
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (samples_per_dataset_[d] > datasets_[d]->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", AbslUnparseFlag(split()), " blend takes ", samples_per_dataset_[d],
          " samples from ", datasets_[d]->dataset_path(), ", which holds ", datasets_[d]->size(),
          "; raise mid_level_dataset_surplus (", surplus, "), e.g. two- or ten-fold"));
    }
  }
  return absl::OkStatus();
}

}  // namespace keel::sampling
