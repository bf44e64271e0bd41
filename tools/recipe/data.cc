#include "tools/recipe/data.h"

#include <ostream>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/indexed_dataset.h"
#include "tools/recipe/corpus.h"
#include "tools/recipe/tokenizer_info.h"

namespace keel::tools::recipe {
namespace {

// Rank 0's part of DataPrefix: builds the default corpus at `prefix` unless it is there.
absl::Status PrepareDefaultCorpus(const TrainOptions& options, const std::string& prefix,
                                  std::ostream& log) {
  if (sampling::IndexedDataset::Open(prefix).ok()) return absl::OkStatus();
  const std::vector<std::string> files = DefaultCorpusFiles();
  if (files.empty()) {
    return absl::NotFoundError(
        "the default corpus (/usr/share/common-licenses, from Debian's base-files) is missing; "
        "set data.prefix to a Megatron indexed dataset");
  }
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(base::ParentDirectory(prefix)));
  KEEL_ASSIGN_OR_RETURN(CorpusStats stats, BuildByteCorpus(files, prefix));
  log << "data: default corpus, " << files.size() << " files from /usr/share/common-licenses, "
      << stats.tokens << " byte tokens -> " << prefix << "\n";
  return absl::OkStatus();
}

// data.prefix, or the default corpus in <run_dir>/data, prepared by rank 0.
absl::StatusOr<std::string> DataPrefix(const TrainOptions& options, const TrainRuntime& runtime) {
  if (!options.data.prefix.empty()) return options.data.prefix;
  const std::string prefix = base::JoinPath(options.run_dir, "data/corpus");
  const absl::Status prepared =
      runtime.rank == 0 ? PrepareDefaultCorpus(options, prefix, *runtime.log) : absl::OkStatus();
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(prepared, runtime, "preparing the default corpus"));
  return prefix;
}

}  // namespace

int64_t SampledWindows(const TrainOptions& options, const Splits& splits) {
  const int64_t global = options.step_scheduler.global_batch_size;
  if (!options.sampler.drop_last || global <= 0) return splits.train_size();
  return splits.train_size() / global * global;
}

absl::StatusOr<at::Tensor> Splits::Batch(const std::vector<int64_t>& indices,
                                         bool validation) const {
  std::vector<at::Tensor> samples;
  for (int64_t index : indices) {
    if (index < 0) continue;
    KEEL_ASSIGN_OR_RETURN(at::Tensor sample,
                          dataset_.Sample(validation ? ValIndex(index) : TrainIndex(index)));
    samples.push_back(std::move(sample));
  }
  if (samples.empty()) return at::Tensor();
  return at::stack(samples);
}

int64_t Splits::TrainIndex(int64_t j) const {
  return every_n_ == 0 ? j : (j / (every_n_ - 1)) * every_n_ + j % (every_n_ - 1);
}

// A dataset that tools:preprocess encoded with a SentencePiece model records its vocabulary:
// the model's embedding must cover it.
absl::Status CheckVocabulary(const TrainOptions& options, const std::string& prefix) {
  KEEL_ASSIGN_OR_RETURN(std::optional<TokenizerInfo> info, ReadTokenizerInfo(prefix));
  if (!info.has_value() || info->vocab_size <= options.model.vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.vocab_size (", options.model.vocab_size, ") is smaller than the vocabulary of ",
      prefix, " (", info->vocab_size, " pieces of ", info->tokenizer_model, ", recorded in ",
      TokenizerInfoPath(prefix), "): set model.vocab_size to at least ", info->vocab_size));
}

absl::StatusOr<TrainData> OpenTrainData(const TrainOptions& options, const TrainRuntime& runtime) {
  KEEL_ASSIGN_OR_RETURN(std::string prefix, DataPrefix(options, runtime));
  KEEL_ASSIGN_OR_RETURN(sampling::IndexedDataset tokens, sampling::IndexedDataset::Open(prefix));
  KEEL_RETURN_IF_ERROR(CheckVocabulary(options, prefix));
  KEEL_ASSIGN_OR_RETURN(sampling::GptDataset windows,
                        sampling::GptDataset::Create(std::move(tokens), options.data.dataset));
  Splits splits(std::move(windows), options.data.validation_every_n_samples);
  absl::StatusOr<std::unique_ptr<sampling::MegatronSampler>> sampler =
      sampling::CreateMegatronSampler(options.sampler, SampledWindows(options, splits),
                                      runtime.dp_rank, runtime.dp_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(
      sampler.status(), absl::StrCat("sampler over ", SampledWindows(options, splits), " of the ",
                                     splits.train_size(), " training windows of ", prefix)));
  return TrainData{std::move(prefix), std::move(splits), *std::move(sampler)};
}

}  // namespace keel::tools::recipe
