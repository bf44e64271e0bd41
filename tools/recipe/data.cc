#include "tools/recipe/data.h"

#include <algorithm>
#include <ostream>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/conversation_dataset.h"
#include "sampling/indexed_dataset.h"
#include "tools/recipe/corpus.h"
#include "tools/recipe/named_dataset.h"

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

// The windows the sampler draws from, of `train_size` training windows.
int64_t Sampled(const TrainOptions& options, int64_t train_size) {
  const int64_t global = options.step_scheduler.global_batch_size;
  if (!options.sampler.drop_last || global <= 0) return train_size;
  return train_size / global * global;
}

// The training windows data.prefix's `num_tokens` make at `sequence_length`.
int64_t TrainingWindows(const TrainOptions& options, int64_t num_tokens, int64_t sequence_length) {
  sampling::FixedWindowDatasetOptions dataset = options.data.dataset;
  dataset.sequence_length = sequence_length;
  return Splits::TrainWindows(sampling::FixedWindowDataset::SizeOf(num_tokens, dataset),
                              options.data.validation_every_n_samples);
}

// A sequence_length longer than the data allows is named with the token counts and the
// longest that works.
absl::Status CheckWindowsFillABatch(const TrainOptions& options, const std::string& prefix,
                                    int64_t num_tokens) {
  const int64_t length = options.data.dataset.sequence_length;
  const auto works = [&](int64_t l) {
    return Sampled(options, TrainingWindows(options, num_tokens, l)) > 0;
  };
  if (works(length)) return absl::OkStatus();
  int64_t longest = 1;  // the longest sequence_length > 1 that works, found by bisection
  for (int64_t low = 2, high = length - 1; low <= high;) {
    const int64_t mid = low + (high - low) / 2;
    if (works(mid)) {
      longest = mid;
      low = mid + 1;
    } else {
      high = mid - 1;
    }
  }
  const bool drop_last = options.sampler.drop_last;
  return absl::InvalidArgumentError(absl::StrCat(
      "data.sequence_length (", length, ") is longer than ", prefix, " allows: its ", num_tokens,
      " tokens make ", TrainingWindows(options, num_tokens, length), " training window(s) of ",
      length, " tokens, and a step needs ",
      drop_last ? absl::StrCat(options.step_scheduler.global_batch_size,
                               " (step_scheduler.global_batch_size, with sampler.drop_last)")
                : "1",
      longest > 1 ? absl::StrCat("; sequence lengths up to ", longest, " work")
                  : "; give it more text"));
}

// data.prefix, or the default corpus in <run_dir>/data, prepared by rank 0.
absl::StatusOr<std::string> DataPrefix(const TrainOptions& options, const TrainRuntime& runtime) {
  if (!options.data.prefix.empty()) return options.data.prefix;
  const std::string prefix = base::JoinPath(options.run_dir, "data/corpus");
  KEEL_RETURN_IF_ERROR(RunOnRankZero(
      runtime, "preparing the default corpus",
      [&] { return PrepareDefaultCorpus(options, prefix, *runtime.log); },
      RankZeroWaitFor(options)));
  return prefix;
}

}  // namespace

int64_t SampledWindows(const TrainOptions& options, const Splits& splits) {
  return Sampled(options, splits.train_size());
}

SampleShape ShapeOf(const TrainOptions& options, const Splits& splits) {
  const SftData* sft = splits.sft();
  if (sft == nullptr) return {"windows", options.data.dataset.sequence_length};
  return {sft->packs() ? "packs" : "conversations", sft->sample_length()};
}

TokenBatch TokenBatch::To(const at::Device& device) const {
  if (!defined()) return *this;
  return {inputs.to(device), labels.to(device),
          loss_mask.defined() ? loss_mask.to(device) : at::Tensor(),
          packed.defined() ? packed.To(device) : base::PackedSequences()};
}

Splits::Splits(std::unique_ptr<MegatronData> megatron) : megatron_(std::move(megatron)) {}
Splits::Splits(std::unique_ptr<SftData> sft) : sft_(std::move(sft)) {}
Splits::Splits(Splits&&) noexcept = default;
Splits& Splits::operator=(Splits&&) noexcept = default;
Splits::~Splits() = default;

int64_t Splits::TrainWindows(int64_t windows, int64_t every_n) {
  return every_n == 0 ? windows : windows - windows / every_n;
}

int64_t Splits::train_size() const {
  if (megatron_ != nullptr) return megatron_->train_size();
  if (sft_ != nullptr) return sft_->train_size();
  return TrainWindows(windows_->size(), every_n_);
}

int64_t Splits::val_size() const {
  if (megatron_ != nullptr) return megatron_->val_size();
  if (sft_ != nullptr) return sft_->val_size();
  return every_n_ == 0 ? 0 : windows_->size() / every_n_;
}

absl::StatusOr<TokenBatch> Splits::Batch(const std::vector<int64_t>& indices,
                                         bool validation) const {
  if (megatron_ == nullptr && sft_ == nullptr) return WindowBatch(indices, validation);
  std::vector<int64_t> kept;
  for (int64_t index : indices) {
    if (index >= 0) kept.push_back(index);
  }
  if (kept.empty()) return TokenBatch();
  const int64_t n = static_cast<int64_t>(kept.size());
  const int64_t L = megatron_ != nullptr ? megatron_->sequence_length() : sft_->sample_length();
  TokenBatch batch{at::empty({n, L}, at::kLong), at::empty({n, L}, at::kLong),
                   at::empty({n, L}, at::kFloat), base::PackedSequences()};
  const bool packs = sft_ != nullptr && sft_->packs();
  std::vector<std::vector<int64_t>> lengths(packs ? n : 0);
  for (int64_t i = 0; i < n; ++i) {
    const SampleRow row{batch.inputs[i].data_ptr<int64_t>(), batch.labels[i].data_ptr<int64_t>(),
                        batch.loss_mask[i].data_ptr<float>(), packs ? &lengths[i] : nullptr};
    KEEL_RETURN_IF_ERROR(megatron_ != nullptr ? megatron_->Fill(kept[i], validation, row)
                                              : sft_->Fill(kept[i], validation, row));
  }
  if (packs) batch.packed = base::PackRows(lengths, L);
  return batch;
}

absl::StatusOr<TokenBatch> Splits::WindowBatch(const std::vector<int64_t>& indices,
                                               bool validation) const {
  std::vector<at::Tensor> samples;
  for (int64_t index : indices) {
    if (index < 0) continue;
    KEEL_ASSIGN_OR_RETURN(at::Tensor sample,
                          windows_->Sample(validation ? ValIndex(index) : TrainIndex(index)));
    samples.push_back(std::move(sample));
  }
  if (samples.empty()) return TokenBatch();
  const at::Tensor windows = at::stack(samples);
  return TokenBatch{windows.slice(1, 0, -1), windows.slice(1, 1), at::Tensor(),
                    base::PackedSequences()};
}

int64_t Splits::TrainIndex(int64_t j) const {
  return every_n_ == 0 ? j : (j / (every_n_ - 1)) * every_n_ + j % (every_n_ - 1);
}

// The Megatron datasets of data.paths, with the sampler over their training split.
absl::StatusOr<TrainData> OpenMegatronData(const TrainOptions& options, const TrainRuntime& runtime,
                                           bool plan_only) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<MegatronData> megatron,
                        MegatronData::Open(options, runtime, plan_only));
  // Read before the move: GCC's -O2 cannot see that a Splits of Megatron data never reads
  // its windows (-Wmaybe-uninitialized).
  const int64_t train_size = megatron->train_size();
  Splits splits(std::move(megatron));
  absl::StatusOr<std::unique_ptr<sampling::MegatronSampler>> sampler =
      sampling::CreateMegatronSampler(options.sampler, Sampled(options, train_size),
                                      runtime.dp_rank, runtime.dp_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(
      sampler.status(), absl::StrCat("sampler over ", Sampled(options, train_size), " of the ",
                                     train_size, " training samples of data.paths")));
  return TrainData{options.data.megatron.paths, std::move(splits), *std::move(sampler)};
}

// The conversations of data.format "sft" at data.prefix, with the sampler over their training
// split.
absl::StatusOr<TrainData> OpenSftData(const TrainOptions& options, const TrainRuntime& runtime) {
  const std::string& prefix = options.data.prefix;
  KEEL_RETURN_IF_ERROR(OpenNamedDataset("data.prefix", prefix).status());
  const std::string mask = sampling::ConversationDataset::LossMaskPrefix(prefix);
  if (absl::IsNotFound(sampling::IndexedDataset::Open(mask).status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.prefix (", prefix, ") holds tokens but no loss mask (", mask,
        ".bin/.idx): data.format \"sft\" trains on conversations that "
        "tools/scripts/hf_sft_tokenize.py writes; a token stream trains with data.format "
        "\"pretraining\""));
  }
  KEEL_RETURN_IF_ERROR(
      CheckDataFitsModel(prefix, {options.model.vocab_size, options.pretrained_path}));
  absl::StatusOr<std::unique_ptr<SftData>> sft =
      SftData::Open(prefix, options.data.sft, options.data.dataset.sequence_length,
                    options.data.validation_every_n_samples, options.packed_sequence);
  KEEL_RETURN_IF_ERROR(base::Annotate(sft.status(), "data.prefix (data.format \"sft\")"));
  if (runtime.rank == 0) {
    const SftData& data = **sft;
    *runtime.log << "data: " << data.train_conversations() << " training and "
                 << data.val_conversations() << " validation conversations of " << prefix;
    if (data.packs()) {
      *runtime.log << ", packed into " << data.train_size() << " and " << data.val_size()
                   << " sequences of " << data.sample_length()
                   << " tokens (packed_sequence.packed_sequence_size)";
    }
    if (data.overlong() > 0) {
      *runtime.log << "; " << data.overlong() << " longer than data.sequence_length + 1 ("
                   << options.data.dataset.sequence_length + 1 << ") tokens "
                   << (data.options().overlong == Overlong::kDrop ? "dropped" : "truncated")
                   << " (data.overlong)";
    }
    if (data.unpackable() > 0) {
      *runtime.log << "; " << data.unpackable() << " predicting more than " << data.sample_length()
                   << " tokens dropped (they fit no pack)";
    }
    *runtime.log << "\n";
  }
  // Read before the move, as OpenMegatronData does (GCC's -O2 -Wmaybe-uninitialized).
  const int64_t train_size = (*sft)->train_size();
  Splits splits(*std::move(sft));
  const int64_t sampled = Sampled(options, train_size);
  absl::StatusOr<std::unique_ptr<sampling::MegatronSampler>> sampler =
      sampling::CreateMegatronSampler(options.sampler, sampled, runtime.dp_rank, runtime.dp_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(
      sampler.status(),
      absl::StrCat("sampler over ", sampled, " of the ", train_size, " training ",
                   options.packed_sequence.packed_sequence_size > 0 ? "packs" : "conversations",
                   " of ", prefix)));
  return TrainData{prefix, std::move(splits), *std::move(sampler)};
}

// OpenTrainData on this rank alone.
absl::StatusOr<TrainData> OpenOnRank(const TrainOptions& options, const TrainRuntime& runtime,
                                     bool plan_only) {
  if (!options.data.megatron.paths.empty()) return OpenMegatronData(options, runtime, plan_only);
  if (options.data.sft.format == DataFormat::kSft) return OpenSftData(options, runtime);
  KEEL_ASSIGN_OR_RETURN(std::string prefix, DataPrefix(options, runtime));
  KEEL_ASSIGN_OR_RETURN(sampling::IndexedDataset tokens, OpenNamedDataset("data.prefix", prefix));
  KEEL_RETURN_IF_ERROR(
      CheckDataFitsModel(prefix, {options.model.vocab_size, options.pretrained_path}));
  const int64_t num_tokens = tokens.num_tokens();
  KEEL_ASSIGN_OR_RETURN(
      sampling::FixedWindowDataset windows,
      sampling::FixedWindowDataset::Create(std::move(tokens), options.data.dataset));
  Splits splits(std::move(windows), options.data.validation_every_n_samples);
  KEEL_RETURN_IF_ERROR(CheckWindowsFillABatch(options, prefix, num_tokens));
  absl::StatusOr<std::unique_ptr<sampling::MegatronSampler>> sampler =
      sampling::CreateMegatronSampler(options.sampler, SampledWindows(options, splits),
                                      runtime.dp_rank, runtime.dp_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(
      sampler.status(), absl::StrCat("sampler over ", SampledWindows(options, splits), " of the ",
                                     splits.train_size(), " training windows of ", prefix)));
  return TrainData{std::move(prefix), std::move(splits), *std::move(sampler)};
}

absl::StatusOr<TrainData> OpenTrainData(const TrainOptions& options, const TrainRuntime& runtime,
                                        bool plan_only) {
  // Each rank opens the files rank 0 prepared: one that cannot (a file a network file system
  // does not show it yet) fails every rank at once with its error, not its peers at their next
  // collective's timeout.
  absl::StatusOr<TrainData> data = OpenOnRank(options, runtime, plan_only);
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(data.status(), runtime, "opening the training data"));
  return data;
}

}  // namespace keel::tools::recipe
