#include "tools/recipe/megatron_data.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "sampling/indexed_dataset.h"
#include "tools/recipe/named_dataset.h"
#include "tools/recipe/token_range.h"

namespace keel::tools::recipe {
namespace {

using sampling::GptSplitView;
using sampling::IndexCacheMode;

// Rank 0's checks of the datasets before any index is built: their tokens scanned once per
// dataset (CheckTokenRange's record, beside the index cache).
absl::Status CheckDatasets(const TrainOptions& options, const sampling::GptDatasetConfig& config) {
  for (const std::string& prefix : config.blend->prefixes) {
    KEEL_ASSIGN_OR_RETURN(const sampling::IndexedDataset dataset,
                          OpenNamedDataset("data.paths", prefix));
    KEEL_RETURN_IF_ERROR(
        CheckDataFitsModel(prefix, {options.model.vocab_size, options.pretrained_path}));
    KEEL_RETURN_IF_ERROR(
        CheckTokenRange(dataset, prefix, options.model.vocab_size,
                        sampling::IndexCacheDirectory(config, prefix, "GPTDataset")));
  }
  return absl::OkStatus();
}

// Every dataset of a split must hold one sample's tokens.
absl::Status CheckLengths(const GptSplitView& view, const sampling::GptDatasetConfig& config,
                          const char* split) {
  const int64_t needed = config.sequence_length + (config.add_extra_token_to_sequence ? 1 : 0);
  for (const auto& dataset : view.datasets()) {
    if (dataset->tokens_per_epoch() >= needed) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "data.sequence_length (", config.sequence_length, ") is longer than the ", split,
        " documents of ", dataset->dataset_path(), " (", dataset->tokens_per_epoch(),
        " tokens): a sample needs ", needed, "; shorten it or give the split more documents"));
  }
  return absl::OkStatus();
}

// Builds on rank 0 (or plans), then loads on the others.
absl::StatusOr<sampling::GptDatasetSplits> BuildOnRankZeroFirst(
    const TrainOptions& options, const TrainRuntime& runtime,
    const sampling::GptDatasetConfig& config, bool plan_only) {
  sampling::GptBuildOptions build;
  build.splits_to_build = {true, true, false};
  if (plan_only) {
    build.cache_mode = IndexCacheMode::kPlanOnly;
    return sampling::BuildGptDatasets(config, MegatronSizes(options), build);
  }
  absl::StatusOr<sampling::GptDatasetSplits> splits;
  KEEL_RETURN_IF_ERROR(RunOnRankZero(
      runtime, "building the GPT dataset indices",
      [&] {
        KEEL_RETURN_IF_ERROR(CheckDatasets(options, config));
        splits = sampling::BuildGptDatasets(config, MegatronSizes(options), build);
        return base::Annotate(splits.status(),
                              absl::StrCat("data.split \"", options.data.megatron.split, "\""));
      },
      RankZeroWaitFor(options)));
  if (runtime.rank == 0) return splits;
  build.cache_mode = IndexCacheMode::kLoadOnly;
  return sampling::BuildGptDatasets(config, MegatronSizes(options), build);
}

void DescribeSplit(const char* name, const GptSplitView& view, std::ostream& out) {
  out << "  " << name << ": " << view.size() << " samples"
      << (view.blend() != nullptr ? " (blend)" : "") << "\n";
  for (size_t d = 0; d < view.datasets().size(); ++d) {
    const auto& dataset = *view.datasets()[d];
    const auto& blend = view.blend();
    out << "    " << dataset.dataset_path() << ": weight "
        << (blend != nullptr ? blend->weights()[d] : 1.0) << ", "
        << (blend != nullptr ? blend->samples_per_dataset()[d] : view.size()) << " samples drawn, "
        << dataset.num_epochs() << " epoch(s) of documents [" << dataset.indexed_indices().first
        << ", " << dataset.indexed_indices().second << ")\n";
  }
}

}  // namespace

absl::StatusOr<sampling::GptDatasetConfig> MegatronConfig(const TrainOptions& options) {
  sampling::GptDatasetConfig config;
  config.random_seed = options.data.megatron.seed;
  config.sequence_length = options.data.dataset.sequence_length;
  const std::vector<std::string> items =
      absl::StrSplit(options.data.megatron.paths, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  KEEL_ASSIGN_OR_RETURN(config.blend, sampling::GetBlendFromList(items));
  if (config.blend->prefixes.size() == 1) config.blend->weights.reset();  // as NeMo
  config.split = options.data.megatron.split;
  if (!options.data.megatron.index_mapping_dir.empty()) {
    config.path_to_cache = options.data.megatron.index_mapping_dir;
  }
  config.tokenizer.vocab_size = options.model.vocab_size;
  config.tokenizer.unique_identifiers = {{"class", "keel.tools.train"}};
  config.reset_position_ids = config.reset_attention_mask = config.eod_mask_loss = false;
  config.add_extra_token_to_sequence = options.data.dataset.add_extra_token_to_sequence;
  return config;
}

sampling::SplitSizes MegatronSizes(const TrainOptions& options) {
  const scheduling::StepSchedulerOptions& s = options.step_scheduler;
  const int64_t steps = s.max_steps.value_or(0);
  const int64_t val_every = s.val_every_steps.value_or(1000);
  return {steps * s.global_batch_size,
          steps / std::max<int64_t>(val_every, 1) * s.global_batch_size, 0};
}

absl::StatusOr<std::unique_ptr<MegatronData>> MegatronData::Open(const TrainOptions& options,
                                                                 const TrainRuntime& runtime,
                                                                 bool plan_only) {
  std::unique_ptr<MegatronData> data(new MegatronData());
  KEEL_ASSIGN_OR_RETURN(data->config_, MegatronConfig(options));
  KEEL_ASSIGN_OR_RETURN(sampling::GptDatasetSplits splits,
                        BuildOnRankZeroFirst(options, runtime, data->config_, plan_only));
  if (!splits[0].has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("data.split \"", options.data.megatron.split,
                                                   "\" gives training no documents"));
  }
  KEEL_ASSIGN_OR_RETURN(data->train_view_, GptSplitView::Of(splits[0]));
  KEEL_RETURN_IF_ERROR(CheckLengths(data->train_view_, data->config_, "training"));
  const int64_t wanted = MegatronSizes(options)[0].value_or(0);
  if (data->train_view_.size() < wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training split holds ", data->train_view_.size(), " samples (one epoch of each ",
        "unweighted dataset), fewer than max_steps x global_batch_size = ", wanted,
        ": give data.paths weights, or lower step_scheduler.max_steps"));
  }
  if (splits[1].has_value()) {
    KEEL_ASSIGN_OR_RETURN(data->valid_, GptSplitView::Of(splits[1]));
    KEEL_RETURN_IF_ERROR(CheckLengths(*data->valid_, data->config_, "validation"));
  }
  KEEL_ASSIGN_OR_RETURN(data->train_,
                        sampling::ResumableBlend::Fresh(data->train_view_, data->config_));
  return data;
}

absl::Status MegatronData::Fill(int64_t index, bool validation, const SampleRow& row) {
  const int64_t L = config_.sequence_length;
  const auto write = [&](const sampling::MegatronGptDataset& dataset, int64_t sample) {
    return dataset.Sample(sample, absl::MakeSpan(row.tokens, L), absl::MakeSpan(row.labels, L),
                          absl::MakeSpan(row.loss_mask, L));
  };
  if (validation) {
    if (!valid_.has_value()) return absl::OutOfRangeError("the run has no validation split");
    KEEL_ASSIGN_OR_RETURN(sampling::GptSampleRef ref, valid_->Locate(index));
    return write(*valid_->datasets()[ref.dataset], ref.dataset_sample);
  }
  KEEL_ASSIGN_OR_RETURN(sampling::BlendSample sample, train_->Locate(index));
  return write(*sample.gpt, sample.sample);
}

absl::StatusOr<SampleSource> MegatronData::Window(int64_t index, bool validation,
                                                  std::vector<int64_t>& tokens) {
  const sampling::MegatronGptDataset* dataset;
  int64_t sample;
  SampleSource source;
  if (validation) {
    if (!valid_.has_value()) return absl::OutOfRangeError("the run has no validation split");
    KEEL_ASSIGN_OR_RETURN(sampling::GptSampleRef ref, valid_->Locate(index));
    dataset = valid_->datasets()[ref.dataset].get();
    sample = source.dataset_sample = ref.dataset_sample;
  } else {
    KEEL_ASSIGN_OR_RETURN(sampling::BlendSample located, train_->Locate(index));
    dataset = located.gpt;
    sample = located.sample;
    source.dataset_sample = located.stream_sample;
  }
  source.dataset = dataset->dataset_path();
  tokens.resize(dataset->window_size());
  KEEL_RETURN_IF_ERROR(dataset->Window(sample, absl::MakeSpan(tokens)));
  return source;
}

absl::Status MegatronData::Resume(const sampling::BlendState& saved, const TrainOptions& options,
                                  const TrainRuntime& runtime) {
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<sampling::ResumableBlend>> continued;
  KEEL_RETURN_IF_ERROR(RunOnRankZero(
      runtime, "continuing the training blend",
      [&] {
        continued = sampling::ResumableBlend::Continue(saved, train_view_, config_,
                                                       IndexCacheMode::kBuild, &notes);
        return continued.status();
      },
      RankZeroWaitFor(options)));
  if (runtime.rank != 0) {
    continued = sampling::ResumableBlend::Continue(saved, train_view_, config_,
                                                   IndexCacheMode::kLoadOnly, &notes);
    KEEL_RETURN_IF_ERROR(continued.status());
  }
  if (!notes.empty() && options.sampler.dataloader_type == sampling::DataloaderType::kCyclic) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the training blend changed since the checkpoint (", absl::StrJoin(notes, "; "),
        "), which only sampler.dataloader_type \"single\" can continue: the \"cyclic\" sampler "
        "does not consume samples in order; resume with the checkpoint's data.paths"));
  }
  if (runtime.rank == 0) {
    for (const std::string& note : notes) *runtime.log << "warning: data: " << note << "\n";
  }
  train_ = *std::move(continued);
  return absl::OkStatus();
}

void MegatronData::Describe(std::ostream& out) const {
  out << "data: Megatron GPT datasets, split \"" << config_.split.value_or("") << "\", seed "
      << config_.random_seed << ", index cache "
      << config_.path_to_cache.value_or("beside each dataset") << "\n";
  DescribeSplit("train", train_view_, out);
  if (valid_.has_value()) DescribeSplit("validation", *valid_, out);
}

}  // namespace keel::tools::recipe
