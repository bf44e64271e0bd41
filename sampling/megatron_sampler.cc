#include "sampling/megatron_sampler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/ops/randperm.h"
#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "sampling/internal/feistel.h"

namespace keel::sampling {
namespace {

constexpr base::EnumSpelling<DataloaderType> kDataloaderTypes[] = {
    {DataloaderType::kSingle, "single"},
    {DataloaderType::kCyclic, "cyclic"},
};
constexpr base::EnumSpelling<RandomPermutation> kRandomPermutations[] = {
    {RandomPermutation::kRandperm, "randperm"},
    {RandomPermutation::kFeistel, "feistel"},
};
constexpr base::EnumSpelling<ShuffleScope> kShuffleScopes[] = {
    {ShuffleScope::kPerRank, "per_rank"},
    {ShuffleScope::kGlobal, "global"},
};

int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// BaseMegatronSampler.__len__ with global_batch_size: whole global batches of `samples`
// (rounded as drop_last says), counted in micro-batches.
int64_t GlobalBatchLen(int64_t samples, int64_t global_batch_size, bool drop_last,
                       int64_t micro_batch_times_data_parallel_size) {
  const int64_t global_batches =
      drop_last ? samples / global_batch_size : CeilDiv(samples, global_batch_size);
  return global_batches * (global_batch_size / micro_batch_times_data_parallel_size);
}

// The order of `size` indices for an epoch seeded with `epoch_seed`: a randperm tensor or a
// Feistel bijection, whichever `kind` says.
void MakeOrder(RandomPermutation kind, int64_t size, uint64_t epoch_seed, at::Tensor& permutation,
               std::unique_ptr<internal::FeistelPermutation>& feistel) {
  if (kind == RandomPermutation::kRandperm) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(epoch_seed);
    permutation = at::randperm(size, generator, at::kLong);
  } else {
    feistel =
        std::make_unique<internal::FeistelPermutation>(static_cast<uint64_t>(size), epoch_seed);
  }
}

// Element `i` of the order MakeOrder made.
int64_t OrderAt(const at::Tensor& permutation, const internal::FeistelPermutation* feistel,
                int64_t i) {
  if (feistel != nullptr) return static_cast<int64_t>((*feistel)(static_cast<uint64_t>(i)));
  return permutation.data_ptr<int64_t>()[i];
}

// Python's seed + epoch; an int64 sum past 2^63 wraps, where Python would refuse a seed of 2^64
// or more. CPUGeneratorImpl keeps the low 32 bits, as manual_seed does.
uint64_t EpochSeed(int64_t seed, int64_t epoch) {
  return static_cast<uint64_t>(seed) + static_cast<uint64_t>(epoch);
}

}  // namespace

bool AbslParseFlag(absl::string_view text, DataloaderType* out, std::string* error) {
  return base::ParseEnum(kDataloaderTypes, text, out, error);
}
bool AbslParseFlag(absl::string_view text, RandomPermutation* out, std::string* error) {
  return base::ParseEnum(kRandomPermutations, text, out, error);
}
bool AbslParseFlag(absl::string_view text, ShuffleScope* out, std::string* error) {
  return base::ParseEnum(kShuffleScopes, text, out, error);
}
std::string AbslUnparseFlag(ShuffleScope scope) {
  return std::string(base::EnumName(kShuffleScopes, scope));
}
std::string AbslUnparseFlag(DataloaderType type) {
  return std::string(base::EnumName(kDataloaderTypes, type));
}
std::string AbslUnparseFlag(RandomPermutation permutation) {
  return std::string(base::EnumName(kRandomPermutations, permutation));
}

// ---------------------------------------------------------------------------------------
// MegatronSampler

MegatronSampler::MegatronSampler(const PretrainingSamplerOptions& options, bool shuffles)
    : options_(options),
      shuffles_(shuffles),
      micro_batch_times_data_parallel_size_(options.micro_batch_size * options.data_parallel_size) {
}

absl::Status MegatronSampler::ValidateBase(const PretrainingSamplerOptions& o) {
  if (o.total_samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_samples (", o.total_samples, ") must be > 0: no sample to consume"));
  }
  if (o.micro_batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batch_size (", o.micro_batch_size, ") must be > 0"));
  }
  if (o.data_parallel_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_parallel_size (", o.data_parallel_size, ") must be > 0"));
  }
  if (o.data_parallel_rank < 0 || o.data_parallel_rank >= o.data_parallel_size) {
    return absl::InvalidArgumentError(absl::StrCat("data_parallel_rank (", o.data_parallel_rank,
                                                   ") must be in [0, data_parallel_size (",
                                                   o.data_parallel_size, "))"));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (o.micro_batch_size > kMax / o.data_parallel_size) {
    return absl::InvalidArgumentError(absl::StrCat("micro_batch_size (", o.micro_batch_size,
                                                   ") x data_parallel_size (", o.data_parallel_size,
                                                   ") overflows int64"));
  }
  const int64_t group = o.micro_batch_size * o.data_parallel_size;
  if (o.global_batch_size.has_value()) {
    const int64_t global_batch_size = *o.global_batch_size;
    if (global_batch_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("global_batch_size (", global_batch_size, ") must be > 0"));
    }
    if (global_batch_size % group != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "global_batch_size (", global_batch_size, ") must be divisible by micro_batch_size (",
          o.micro_batch_size, ") x data_parallel_size (", o.data_parallel_size, ") = ", group));
    }
    if (o.total_samples > kMax - global_batch_size) {
      return absl::InvalidArgumentError(absl::StrCat("total_samples (", o.total_samples,
                                                     ") + global_batch_size (", global_batch_size,
                                                     ") overflows int64"));
    }
  }
  if (o.pad_samples_to_global_batch_size && !o.global_batch_size.has_value()) {
    return absl::InvalidArgumentError(
        "pad_samples_to_global_batch_size can be true only when global_batch_size is set");
  }
  return absl::OkStatus();
}

MegatronSampler::Iterator MegatronSampler::begin() {
  EndPass();
  ++pass_;
  StartPass();
  Iterator it(this, pass_);
  if (!NextMicroBatch(batch_)) {
    EndPass();
    ++pass_;
  }
  return it;
}

MegatronSampler::Iterator& MegatronSampler::Iterator::operator++() {
  if (*this == End{}) return *this;
  if (!sampler_->NextMicroBatch(sampler_->batch_)) {
    sampler_->EndPass();
    ++sampler_->pass_;
  }
  return *this;
}

absl::Status MegatronSampler::LoadState(const MegatronSamplerState& state) {
  if (state.consumed_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("consumed_samples (", state.consumed_samples, ") must be >= 0"));
  }
  if (state.epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("epoch (", state.epoch, ") must be >= 0"));
  }
  const int64_t per_epoch = SamplesPerEpoch();
  if (per_epoch == 0) {
    if (state.consumed_samples != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumed_samples (", state.consumed_samples,
                       ") must be 0: a pass of this sampler yields nothing"));
    }
  } else if (state.consumed_samples % per_epoch % micro_batch_times_data_parallel_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consumed_samples (", state.consumed_samples,
        ") must sit on a micro-batch group boundary of its epoch: its remainder modulo the ",
        per_epoch,
        " samples of an epoch must be a multiple of micro_batch_size x "
        "data_parallel_size (",
        micro_batch_times_data_parallel_size_, ")"));
  }
  if (!shuffles_ && state.seed != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seed (", state.seed, ") must be 0 in a MegatronPretrainingSampler state: it has none"));
  }
  EndPass();
  ++pass_;
  consumed_samples_ = state.consumed_samples;
  epoch_ = state.epoch;
  options_.seed = state.seed;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// MegatronPretrainingSampler

MegatronPretrainingSampler::MegatronPretrainingSampler(const PretrainingSamplerOptions& options)
    : MegatronSampler(options, /*shuffles=*/false) {
  const int64_t total = options_.total_samples;
  const int64_t group = micro_batch_times_data_parallel_size_;
  if (options_.drop_last) {
    samples_per_epoch_ = total / group * group;
  } else if (options_.pad_samples_to_global_batch_size) {
    samples_per_epoch_ = CeilDiv(total, *options_.global_batch_size) * *options_.global_batch_size;
  } else {
    samples_per_epoch_ = total;
  }
}

absl::StatusOr<std::unique_ptr<MegatronPretrainingSampler>> MegatronPretrainingSampler::Create(
    const PretrainingSamplerOptions& options) {
  KEEL_RETURN_IF_ERROR(ValidateBase(options));
  if (options.seed != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seed (", options.seed, ") must be 0: MegatronPretrainingSampler does not shuffle"));
  }
  if (options.random_permutation != RandomPermutation::kRandperm) {
    return absl::InvalidArgumentError(
        absl::StrCat("random_permutation (\"", AbslUnparseFlag(options.random_permutation),
                     "\") must be \"randperm\": MegatronPretrainingSampler does not shuffle"));
  }
  return std::unique_ptr<MegatronPretrainingSampler>(new MegatronPretrainingSampler(options));
}

int64_t MegatronPretrainingSampler::size() const {
  const int64_t group = micro_batch_times_data_parallel_size_;
  if (options_.global_batch_size.has_value()) {
    return GlobalBatchLen(options_.total_samples, *options_.global_batch_size, options_.drop_last,
                          group);
  }
  // (total_samples - 1) // group + 1, whatever drop_last says.
  return CeilDiv(options_.total_samples, group);
}

int64_t MegatronPretrainingSampler::NumMicroBatches() const {
  if (samples_per_epoch_ == 0) return 0;
  return CeilDiv(samples_per_epoch_ - consumed_samples_ % samples_per_epoch_,
                 micro_batch_times_data_parallel_size_);
}

void MegatronPretrainingSampler::StartPass() {
  if (samples_per_epoch_ == 0) {
    position_ = 0;
    return;
  }
  epoch_ = consumed_samples_ / samples_per_epoch_;
  position_ = consumed_samples_ % samples_per_epoch_;
}

bool MegatronPretrainingSampler::NextMicroBatch(std::vector<int64_t>& batch) {
  if (position_ >= samples_per_epoch_) return false;
  const int64_t group =
      std::min(micro_batch_times_data_parallel_size_, samples_per_epoch_ - position_);
  // This rank's slice of the group, clipped to the group as Python's list slicing does.
  const int64_t begin = std::min(group, options_.data_parallel_rank * options_.micro_batch_size);
  const int64_t end = std::min(group, begin + options_.micro_batch_size);
  batch.clear();
  for (int64_t i = position_ + begin; i < position_ + end; ++i) {
    // Past the data come the padding indices -1, -2, ...
    batch.push_back(i < options_.total_samples ? i : options_.total_samples - 1 - i);
  }
  position_ += group;
  consumed_samples_ += group;
  return true;
}

// ---------------------------------------------------------------------------------------
// MegatronPretrainingRandomSampler

MegatronPretrainingRandomSampler::MegatronPretrainingRandomSampler(
    const PretrainingSamplerOptions& options)
    : MegatronSampler(options, /*shuffles=*/true) {
  const int64_t group = micro_batch_times_data_parallel_size_;
  active_total_samples_ = options_.total_samples / group * group;
  bucket_size_ = options_.total_samples / group * options_.micro_batch_size;
}

absl::StatusOr<std::unique_ptr<MegatronPretrainingRandomSampler>>
MegatronPretrainingRandomSampler::Create(const PretrainingSamplerOptions& options) {
  KEEL_RETURN_IF_ERROR(ValidateBase(options));
  if (options.pad_samples_to_global_batch_size) {
    return absl::InvalidArgumentError(
        "pad_samples_to_global_batch_size must be false: MegatronPretrainingRandomSampler does "
        "not support sample padding");
  }
  const int64_t group = options.micro_batch_size * options.data_parallel_size;
  if (!options.drop_last && group > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drop_last = false needs micro_batch_size (", options.micro_batch_size,
        ") x data_parallel_size (", options.data_parallel_size,
        ") = 1 in MegatronPretrainingRandomSampler; set drop_last = true or use 1 x 1"));
  }
  if (options.total_samples < group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total_samples (", options.total_samples, ") must be >= micro_batch_size (",
        options.micro_batch_size, ") x data_parallel_size (", options.data_parallel_size,
        ") = ", group, " in MegatronPretrainingRandomSampler: no rank would get a sample"));
  }
  return std::unique_ptr<MegatronPretrainingRandomSampler>(
      new MegatronPretrainingRandomSampler(options));
}

int64_t MegatronPretrainingRandomSampler::size() const {
  const int64_t group = micro_batch_times_data_parallel_size_;
  // The reference subtracts the trailing partial group only with drop_last; without it the
  // group is 1 and there is none.
  const int64_t available = active_total_samples_ - consumed_samples_ % active_total_samples_;
  if (options_.global_batch_size.has_value()) {
    return GlobalBatchLen(available, *options_.global_batch_size, options_.drop_last, group);
  }
  return options_.drop_last ? available / group : (available - 1) / group;
}

int64_t MegatronPretrainingRandomSampler::NumMicroBatches() const {
  return (active_total_samples_ - consumed_samples_ % active_total_samples_) /
         micro_batch_times_data_parallel_size_;
}

void MegatronPretrainingRandomSampler::StartPass() {
  epoch_ = consumed_samples_ / active_total_samples_;
  // Samples into the epoch across ranks, hence this rank's position in its bucket.
  bucket_position_ = consumed_samples_ % active_total_samples_ / options_.data_parallel_size;
  MakeOrder(options_.random_permutation, bucket_size_, EpochSeed(options_.seed, epoch_),
            permutation_, feistel_);
}

bool MegatronPretrainingRandomSampler::NextMicroBatch(std::vector<int64_t>& batch) {
  const int64_t micro_batch_size = options_.micro_batch_size;
  // The bucket holds whole micro-batches and passes start on one, so none is partial.
  if (bucket_position_ + micro_batch_size > bucket_size_) return false;
  const int64_t start = options_.data_parallel_rank * bucket_size_;
  batch.resize(micro_batch_size);
  for (int64_t i = 0; i < micro_batch_size; ++i) {
    batch[i] = start + OrderAt(permutation_, feistel_.get(), bucket_position_ + i);
  }
  bucket_position_ += micro_batch_size;
  consumed_samples_ += micro_batch_times_data_parallel_size_;
  return true;
}

MegatronPretrainingRandomSampler::~MegatronPretrainingRandomSampler() = default;

void MegatronPretrainingRandomSampler::EndPass() {
  permutation_ = at::Tensor();
  feistel_.reset();
}

// ---------------------------------------------------------------------------------------
// GlobalRandomSampler

GlobalRandomSampler::GlobalRandomSampler(const PretrainingSamplerOptions& options)
    : MegatronSampler(options, /*shuffles=*/true) {
  const int64_t global_batch_size = *options_.global_batch_size;
  epoch_samples_ = options_.total_samples / global_batch_size * global_batch_size;
}

absl::StatusOr<std::unique_ptr<GlobalRandomSampler>> GlobalRandomSampler::Create(
    const PretrainingSamplerOptions& options) {
  KEEL_RETURN_IF_ERROR(ValidateBase(options));
  if (!options.global_batch_size.has_value()) {
    return absl::InvalidArgumentError(
        "shuffle_scope \"global\" needs global_batch_size: epochs are whole global batches");
  }
  if (options.total_samples < *options.global_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total_samples (", options.total_samples, ") must be >= global_batch_size (",
        *options.global_batch_size, ") with shuffle_scope \"global\": no global batch"));
  }
  return std::unique_ptr<GlobalRandomSampler>(new GlobalRandomSampler(options));
}

GlobalRandomSampler::~GlobalRandomSampler() = default;

int64_t GlobalRandomSampler::NumMicroBatches() const {
  return (epoch_samples_ - consumed_samples_ % epoch_samples_) /
         micro_batch_times_data_parallel_size_;
}

void GlobalRandomSampler::StartPass() {
  epoch_ = consumed_samples_ / epoch_samples_;
  position_ = consumed_samples_ % epoch_samples_;
  MakeOrder(options_.random_permutation, options_.total_samples, EpochSeed(options_.seed, epoch_),
            permutation_, feistel_);
}

bool GlobalRandomSampler::NextMicroBatch(std::vector<int64_t>& batch) {
  if (position_ >= epoch_samples_) return false;
  const int64_t micro_batch_size = options_.micro_batch_size;
  const int64_t start = position_ + options_.data_parallel_rank * micro_batch_size;
  batch.resize(micro_batch_size);
  for (int64_t i = 0; i < micro_batch_size; ++i) {
    batch[i] = OrderAt(permutation_, feistel_.get(), start + i);
  }
  position_ += micro_batch_times_data_parallel_size_;
  consumed_samples_ += micro_batch_times_data_parallel_size_;
  return true;
}

void GlobalRandomSampler::EndPass() {
  permutation_ = at::Tensor();
  feistel_.reset();
}

// ---------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MegatronSampler>> CreateMegatronSampler(
    const MegatronSamplerOptions& options, int64_t dataset_len, int64_t rank, int64_t world_size) {
  PretrainingSamplerOptions sampler;
  sampler.total_samples = dataset_len;
  sampler.micro_batch_size = options.micro_batch_size;
  sampler.data_parallel_rank = rank;
  sampler.data_parallel_size = world_size;
  sampler.drop_last = options.drop_last;
  switch (options.dataloader_type) {
    case DataloaderType::kSingle: {
      sampler.global_batch_size = options.global_batch_size;
      sampler.pad_samples_to_global_batch_size = options.pad_samples_to_global_batch_size;
      if (options.random_permutation != RandomPermutation::kRandperm) {
        return absl::InvalidArgumentError(
            absl::StrCat("random_permutation (\"", AbslUnparseFlag(options.random_permutation),
                         "\") applies to dataloader_type \"cyclic\" only"));
      }
      if (options.shuffle_scope != ShuffleScope::kPerRank) {
        return absl::InvalidArgumentError(
            absl::StrCat("shuffle_scope (\"", AbslUnparseFlag(options.shuffle_scope),
                         "\") applies to dataloader_type \"cyclic\" only"));
      }
      KEEL_ASSIGN_OR_RETURN(auto single, MegatronPretrainingSampler::Create(sampler));
      return std::unique_ptr<MegatronSampler>(std::move(single));
    }
    case DataloaderType::kCyclic: {
      sampler.random_permutation = options.random_permutation;
      if (options.shuffle_scope == ShuffleScope::kGlobal) {
        sampler.global_batch_size = options.global_batch_size;
        KEEL_ASSIGN_OR_RETURN(auto global, GlobalRandomSampler::Create(sampler));
        return std::unique_ptr<MegatronSampler>(std::move(global));
      }
      KEEL_ASSIGN_OR_RETURN(auto cyclic, MegatronPretrainingRandomSampler::Create(sampler));
      return std::unique_ptr<MegatronSampler>(std::move(cyclic));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("dataloader_type (",
                                                 static_cast<int>(options.dataloader_type),
                                                 ") is not one of \"single\", \"cyclic\""));
}

}  // namespace keel::sampling
