#include "sampling/resumable_blend.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace keel::sampling {
namespace {

using GptPtr = std::shared_ptr<const MegatronGptDataset>;

std::vector<double> WeightsOf(const GptSplitView& view) {
  if (view.blend() == nullptr) return {1.0};
  return view.blend()->weights();
}

absl::Status CheckSaved(const BlendState& saved) {
  const size_t n = saved.dataset_paths.size();
  if (n == 0 || saved.weights.size() != n || saved.dataset_consumed.size() != n ||
      saved.generations.size() != n || saved.segment_base.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's blend state does not hold one weight, count, generation list and "
        "base per dataset (",
        n, " datasets)"));
  }
  return absl::OkStatus();
}

std::string Describe(const std::vector<std::string>& paths, const std::vector<double>& weights) {
  std::vector<std::string> parts;
  for (size_t d = 0; d < paths.size(); ++d)
    parts.push_back(absl::StrCat(weights[d], " ", paths[d]));
  return absl::StrJoin(parts, " ");
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResumableBlend>> ResumableBlend::Fresh(
    const GptSplitView& train, const GptDatasetConfig& config) {
  if (train.blend() != nullptr && !train.blend()->requested_size().has_value()) {
    return absl::InvalidArgumentError(
        "a blend without a size (every sample once) cannot be resumed with other weights");
  }
  std::unique_ptr<ResumableBlend> blend(new ResumableBlend());
  blend->megatron_ = train;
  blend->size_ = train.size();
  blend->weights_ = WeightsOf(train);
  for (const GptPtr& dataset : train.datasets()) {
    blend->paths_.push_back(dataset->dataset_path());
    blend->streams_.push_back({dataset});
  }
  const size_t n = blend->paths_.size();
  blend->random_seed_ = config.random_seed;
  blend->split_ = config.split.value_or("");
  blend->segment_base_.assign(n, 0);
  blend->origin_taken_.assign(n, 0);
  blend->taken_.assign(n, 0);
  return blend;
}

absl::StatusOr<std::unique_ptr<ResumableBlend>> ResumableBlend::Continue(
    const BlendState& saved, const GptSplitView& fresh, const GptDatasetConfig& config,
    IndexCacheMode mode, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(CheckSaved(saved));
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<ResumableBlend> blend, Fresh(fresh, config));
  const int64_t consumed = std::min(saved.consumed_samples, blend->size_);
  const std::vector<int64_t> match = blend->Match(saved, notes);
  if (blend->IsPlainResumeOf(saved, match, consumed)) return blend;
  blend->StartSegment(saved, match, consumed, notes);
  KEEL_RETURN_IF_ERROR(blend->RebuildStreams(saved, match, config, mode));
  KEEL_RETURN_IF_ERROR(blend->ExtendStreams(config, mode, notes));
  KEEL_ASSIGN_OR_RETURN(const BlendState continued, blend->State(consumed));
  notes->push_back(absl::StrCat("each dataset continues its stream where it stopped, after ",
                                absl::StrJoin(continued.dataset_consumed, ", "), " samples"));
  return blend;
}

std::vector<int64_t> ResumableBlend::Match(const BlendState& saved,
                                           std::vector<std::string>* notes) const {
  std::vector<int64_t> match(paths_.size(), -1);
  if (saved.split != split_) {
    notes->push_back(absl::StrCat("data.split was \"", saved.split, "\": the training documents ",
                                  "differ, so every dataset starts its stream afresh"));
    return match;
  }
  for (size_t d = 0; d < paths_.size(); ++d) {
    auto it = std::find(saved.dataset_paths.begin(), saved.dataset_paths.end(), paths_[d]);
    if (it != saved.dataset_paths.end()) match[d] = it - saved.dataset_paths.begin();
  }
  for (size_t d = 0; d < paths_.size(); ++d) {
    if (match[d] < 0) notes->push_back(absl::StrCat(paths_[d], " is new: it starts afresh"));
  }
  for (const std::string& path : saved.dataset_paths) {
    if (std::find(paths_.begin(), paths_.end(), path) == paths_.end()) {
      notes->push_back(absl::StrCat(path, " is no longer blended"));
    }
  }
  return match;
}

bool ResumableBlend::IsPlainResumeOf(const BlendState& saved, const std::vector<int64_t>& match,
                                     int64_t consumed) {
  if (saved.segment_start != 0 || saved.random_seed != random_seed_ ||
      saved.dataset_paths != paths_ || saved.weights != weights_) {
    return false;
  }
  for (size_t d = 0; d < paths_.size(); ++d) {
    if (match[d] < 0 || saved.generations[match[d]] !=
                            std::vector<int64_t>{streams_[d][0]->num_samples().value_or(0)}) {
      return false;
    }
  }
  // consumed is within [0, size_]: the state exists.
  const absl::StatusOr<BlendState> state = State(consumed);
  return state.ok() && state->dataset_consumed == saved.dataset_consumed;
}

void ResumableBlend::StartSegment(const BlendState& saved, const std::vector<int64_t>& match,
                                  int64_t consumed, std::vector<std::string>* notes) {
  continued_ = true;
  origin_ = cursor_ = consumed;
  random_seed_ = saved.random_seed;
  std::vector<int64_t> served(paths_.size(), 0);
  for (size_t d = 0; d < paths_.size(); ++d) {
    if (match[d] >= 0) served[d] = saved.dataset_consumed[match[d]];
  }
  const bool same_blend = saved.dataset_paths == paths_ && saved.weights == weights_ &&
                          std::find(match.begin(), match.end(), -1) == match.end();
  if (same_blend) {  // the same greedy goes on from where the checkpoint left it
    segment_start_ = saved.segment_start;
    segment_base_ = saved.segment_base;
  } else {
    notes->push_back(absl::StrCat("the blend was \"", Describe(saved.dataset_paths, saved.weights),
                                  "\", it is \"", Describe(paths_, weights_), "\" from sample ",
                                  consumed, " on"));
    segment_start_ = consumed;
    segment_base_ = served;
  }
  for (size_t d = 0; d < paths_.size(); ++d) origin_taken_[d] = served[d] - segment_base_[d];
  taken_ = origin_taken_;
}

absl::Status ResumableBlend::RebuildStreams(const BlendState& saved,
                                            const std::vector<int64_t>& match,
                                            const GptDatasetConfig& config, IndexCacheMode mode) {
  for (size_t d = 0; d < paths_.size(); ++d) {
    const GptPtr base = streams_[d][0];
    // A new dataset keeps Megatron's generation 0, seeded as the checkpoint's streams.
    const std::vector<int64_t> sizes = match[d] >= 0
                                           ? saved.generations[match[d]]
                                           : std::vector<int64_t>{base->num_samples().value_or(0)};
    if (match[d] < 0 && random_seed_ == config.random_seed) continue;
    streams_[d].clear();
    for (size_t g = 0; g < sizes.size(); ++g) {
      KEEL_ASSIGN_OR_RETURN(GptPtr generation,
                            Generation(*base, sizes[g], static_cast<int64_t>(g), config, mode));
      streams_[d].push_back(std::move(generation));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const MegatronGptDataset>> ResumableBlend::Generation(
    const MegatronGptDataset& base, int64_t num_samples, int64_t g, const GptDatasetConfig& config,
    IndexCacheMode mode) const {
  GptDatasetConfig generation = config;
  generation.random_seed = random_seed_ + g;
  return MegatronGptDataset::Create(base.indexed_dataset(), base.dataset_path(),
                                    base.indexed_indices(), num_samples, Split::kTrain, generation,
                                    mode);
}

absl::Status ResumableBlend::ExtendStreams(const GptDatasetConfig& config, IndexCacheMode mode,
                                           std::vector<std::string>* notes) {
  // The greedy keeps every dataset within one position of its share (its error is the
  // largest, so >= 0, when it takes one): d takes at most weight * positions + 1 of them.
  const double positions = static_cast<double>(size_ - segment_start_);
  for (size_t d = 0; d < paths_.size(); ++d) {
    const int64_t need =
        segment_base_[d] + static_cast<int64_t>(std::ceil(weights_[d] * positions)) + 1;
    int64_t held = 0;
    for (const GptPtr& generation : streams_[d]) held += generation->size();
    if (held >= need) continue;
    const int64_t g = static_cast<int64_t>(streams_[d].size());
    KEEL_ASSIGN_OR_RETURN(GptPtr more, Generation(*streams_[d][0], need - held, g, config, mode));
    notes->push_back(absl::StrCat(paths_[d], " needs up to ", need, " samples, its stream holds ",
                                  held, ": generation ", g, " adds ", more->size(), " (seed ",
                                  random_seed_ + g, ")"));
    streams_[d].push_back(std::move(more));
  }
  return absl::OkStatus();
}

int64_t ResumableBlend::NextDataset() const {
  const double scale = std::max(static_cast<double>(cursor_ - segment_start_), 1.0);
  int64_t best = 0;
  double best_error = weights_[0] * scale - static_cast<double>(taken_[0]);
  for (size_t d = 1; d < weights_.size(); ++d) {
    const double error = weights_[d] * scale - static_cast<double>(taken_[d]);
    if (error > best_error) {
      best = static_cast<int64_t>(d);
      best_error = error;
    }
  }
  return best;
}

absl::Status ResumableBlend::Seek(int64_t position) {
  if (position < cursor_) {
    cursor_ = origin_;
    taken_ = origin_taken_;
  }
  for (; cursor_ < position; ++cursor_) {
    int64_t d = 0;
    if (continued_) {
      d = NextDataset();
    } else {
      KEEL_ASSIGN_OR_RETURN(const GptSampleRef ref, megatron_.Locate(cursor_));
      d = ref.dataset;
    }
    ++taken_[d];
  }
  return absl::OkStatus();
}

absl::StatusOr<BlendSample> ResumableBlend::Locate(int64_t position) {
  if (position < origin_ || position >= size_) {
    return absl::OutOfRangeError(
        absl::StrCat("blend position ", position, " is outside [", origin_, ", ", size_, ")",
                     origin_ > 0 ? " (earlier ones were consumed before the "
                                   "resume)"
                                 : ""));
  }
  BlendSample sample;
  if (!continued_) {
    KEEL_ASSIGN_OR_RETURN(GptSampleRef ref, megatron_.Locate(position));
    sample.dataset = ref.dataset;
    sample.stream_sample = ref.dataset_sample;
  } else {
    KEEL_RETURN_IF_ERROR(Seek(position));
    sample.dataset = NextDataset();
    sample.stream_sample = segment_base_[sample.dataset] + taken_[sample.dataset];
  }
  int64_t j = sample.stream_sample;
  for (const GptPtr& generation : streams_[sample.dataset]) {
    if (j < generation->size()) {
      sample.gpt = generation.get();
      sample.sample = j;
      return sample;
    }
    j -= generation->size();
  }
  return absl::InternalError(absl::StrCat("sample ", sample.stream_sample, " of ",
                                          paths_[sample.dataset], " is past its stream"));
}

absl::StatusOr<BlendState> ResumableBlend::State(int64_t consumed_samples) {
  if (consumed_samples < origin_ || consumed_samples > size_) {
    return absl::OutOfRangeError(absl::StrCat(
        "the blend's state after ", consumed_samples, " samples: outside [", origin_, ", ", size_,
        "], the positions this blend ", origin_ > 0 ? "serves since the resume" : "has"));
  }
  KEEL_RETURN_IF_ERROR(Seek(consumed_samples));
  BlendState state;
  state.consumed_samples = consumed_samples;
  state.dataset_paths = paths_;
  state.weights = weights_;
  for (size_t d = 0; d < paths_.size(); ++d) {
    state.dataset_consumed.push_back(segment_base_[d] + taken_[d]);
    std::vector<int64_t> sizes;
    for (const GptPtr& generation : streams_[d])
      sizes.push_back(generation->num_samples().value_or(0));
    state.generations.push_back(std::move(sizes));
  }
  state.segment_start = segment_start_;
  state.segment_base = segment_base_;
  state.random_seed = random_seed_;
  state.split = split_;
  return state;
}

}  // namespace keel::sampling
