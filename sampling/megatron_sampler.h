// Megatron pretraining batch samplers, index for index with NeMo AutoModel's
// (nemo_automodel/components/datasets/llm/megatron/sampler.py): MegatronPretrainingSampler,
// MegatronPretrainingRandomSampler, the validation and len of BaseMegatronSampler, and
// create_megatron_sampler / MegatronSamplerConfig.build. Each sampler yields one rank's
// micro-batches of dataset indices.
//
//   keel::sampling::MegatronSamplerOptions options;
//   options.micro_batch_size = 4;
//   options.global_batch_size = 64;
//   options.dataloader_type = keel::sampling::DataloaderType::kCyclic;
//   KEEL_ASSIGN_OR_RETURN(auto sampler, CreateMegatronSampler(options, dataset_len, rank, world));
//   for (const std::vector<int64_t>& micro_batch : *sampler) Train(micro_batch);  // one pass
#ifndef KEEL_SAMPLING_MEGATRON_SAMPLER_H_
#define KEEL_SAMPLING_MEGATRON_SAMPLER_H_

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"

namespace keel::sampling {
namespace internal {
class FeistelPermutation;
}  // namespace internal

// create_megatron_sampler's dataloader_type spellings: "single" (MegatronPretrainingSampler),
// "cyclic" (MegatronPretrainingRandomSampler).
enum class DataloaderType { kSingle, kCyclic };

// How the random sampler permutes its bucket each epoch (a Keel addition):
// "randperm": Megatron's torch.randperm(bucket_size) on a CPU generator seeded with
//   seed + epoch, materialized for the pass (8 bytes per sample of the rank's bucket, held
//   from begin() until the pass ends or the next begin()); the index stream equals the
//   Python reference's on the same LibTorch version.
// "feistel": a seeded bijection computed per index (internal/feistel.h), in O(1) memory
//   whatever the bucket size. It is just as resumable, but NOT index-identical to Megatron:
//   use it when a rank's bucket does not fit in memory or when reshuffling dominates.
enum class RandomPermutation { kRandperm, kFeistel };

// What the random sampler shuffles (a Keel addition):
// "per_rank": Megatron's buckets, one per rank, each shuffled on its own
//   (MegatronPretrainingRandomSampler). The buckets depend on the data-parallel size: after a
//   resume on another world size, the rest of the current epoch comes from new buckets, so
//   samples served before the change can come again and others not at all (see that class).
// "global": one permutation of the whole dataset per epoch, which the ranks slice
//   (GlobalRandomSampler): every step sees the same samples on any world size, and an epoch
//   serves each of its samples exactly once however often the world size changes.
enum class ShuffleScope { kPerRank, kGlobal };

// Parse an exact spelling (false and an error listing the spellings otherwise) or give it
// back; these are Abseil's flag hooks, so the enums also work as absl flags.
bool AbslParseFlag(absl::string_view text, DataloaderType* out, std::string* error);
bool AbslParseFlag(absl::string_view text, RandomPermutation* out, std::string* error);
bool AbslParseFlag(absl::string_view text, ShuffleScope* out, std::string* error);
std::string AbslUnparseFlag(DataloaderType type);
std::string AbslUnparseFlag(RandomPermutation permutation);
std::string AbslUnparseFlag(ShuffleScope scope);

// Mirrors MegatronSamplerConfig: same names, order and defaults, plus Keel's
// random_permutation and shuffle_scope. The data-dependent values (dataset_len, rank, world_size)
// are CreateMegatronSampler arguments. NeMo gives the first two no default.
struct MegatronSamplerOptions {
  // Samples per micro-batch on each data-parallel rank. Default: 0 (must be set).
  int64_t micro_batch_size = 0;
  // Samples per optimizer step across all ranks; used by "single" only. Default: 0 (must be set).
  int64_t global_batch_size = 0;
  // Sequential ("single") or shuffled per epoch ("cyclic"). Default: kSingle.
  DataloaderType dataloader_type = DataloaderType::kSingle;
  // Drop the trailing incomplete micro-batch group. Default: true.
  bool drop_last = true;
  // "single" with drop_last = false: pad the last global batch with indices -1, -2, ...
  // Default: false.
  bool pad_samples_to_global_batch_size = false;
  // Keel only: the permutation of "cyclic" (see RandomPermutation). Default: kRandperm.
  RandomPermutation random_permutation = RandomPermutation::kRandperm;
  // Keel only: what "cyclic" shuffles (see ShuffleScope). Default: kPerRank.
  ShuffleScope shuffle_scope = ShuffleScope::kPerRank;
};

template <typename O, typename V, base::IsFieldsOf<O, MegatronSamplerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("micro_batch_size", o.micro_batch_size);
  v("global_batch_size", o.global_batch_size);
  v("dataloader_type", o.dataloader_type);
  v("drop_last", o.drop_last);
  v("pad_samples_to_global_batch_size", o.pad_samples_to_global_batch_size);
  v("random_permutation", o.random_permutation);
  v("shuffle_scope", o.shuffle_scope);
}

// The constructor arguments of MegatronPretrainingSampler and MegatronPretrainingRandomSampler
// (BaseMegatronSampler's, then the random sampler's seed), same names, order and defaults,
// plus Keel's random_permutation. NeMo gives the first four no default.
struct PretrainingSamplerOptions {
  // Samples in the dataset. Default: 0 (must be set).
  int64_t total_samples = 0;
  // Samples per micro-batch on each rank. Default: 0 (must be set).
  int64_t micro_batch_size = 0;
  // This sampler's rank in the data-parallel group. Default: 0.
  int64_t data_parallel_rank = 0;
  // Ranks in the data-parallel group. Default: 0 (must be set).
  int64_t data_parallel_size = 0;
  // Drop the trailing incomplete micro-batch group. Default: true.
  bool drop_last = true;
  // Samples per optimizer step across all ranks; changes only len. Default: nullopt.
  std::optional<int64_t> global_batch_size;
  // Sequential sampler with drop_last = false: pad the last global batch with -1, -2, ...
  // Default: false.
  bool pad_samples_to_global_batch_size = false;
  // Random sampler only: epoch e is shuffled with seed + e. Default: 0.
  int64_t seed = 0;
  // Keel only, random sampler only: see RandomPermutation. Default: kRandperm.
  RandomPermutation random_permutation = RandomPermutation::kRandperm;
};

template <typename O, typename V, base::IsFieldsOf<O, PretrainingSamplerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("total_samples", o.total_samples);
  v("micro_batch_size", o.micro_batch_size);
  v("data_parallel_rank", o.data_parallel_rank);
  v("data_parallel_size", o.data_parallel_size);
  v("drop_last", o.drop_last);
  v("global_batch_size", o.global_batch_size);
  v("pad_samples_to_global_batch_size", o.pad_samples_to_global_batch_size);
  v("seed", o.seed);
  v("random_permutation", o.random_permutation);
}

// What a checkpoint stores to continue a sampler's index stream: the random sampler's
// attributes of the same names. consumed_samples counts samples across all ranks since the
// first epoch; it alone positions the stream. epoch is the epoch of the pass last started (0
// before any), kept for reporting. seed is the random sampler's (0 for the sequential one).
struct MegatronSamplerState {
  int64_t consumed_samples = 0;
  int64_t epoch = 0;
  int64_t seed = 0;
};

template <typename O, typename V, base::IsFieldsOf<O, MegatronSamplerState> = 0>
void VisitFields(O& o, V&& v) {
  v("consumed_samples", o.consumed_samples);
  v("epoch", o.epoch);
  v("seed", o.seed);
}

// BaseMegatronSampler: one data-parallel rank's stream of micro-batches, as a range of
// passes. Each begin() starts a pass (Python's iter(sampler)) at consumed_samples and yields
// std::vector<int64_t> micro-batches; abandoning a pass keeps what it consumed. It works as
// the data source of a keel::scheduling::StepScheduler (begin/end, size, SetEpoch).
//
// Not thread-safe. Samplers do not move (iterators point to them): Create returns a
// std::unique_ptr.
class MegatronSampler {
 public:
  class Iterator;
  struct End {};

  MegatronSampler(const MegatronSampler&) = delete;
  MegatronSampler& operator=(const MegatronSampler&) = delete;
  virtual ~MegatronSampler() = default;

  // Python's len(sampler), the reference's quirks included, because NeMo's StepScheduler
  // derives its epoch length from it. It is not always the number of micro-batches a pass
  // yields (NumMicroBatches() is): see each sampler.
  virtual int64_t size() const = 0;

  // The exact number of micro-batches a pass started now yields.
  virtual int64_t NumMicroBatches() const = 0;

  // Starts a pass at consumed_samples: the iterator is on its first micro-batch, or equals
  // end() if the pass is empty. Starting a pass, or LoadState, ends the previous pass: its
  // iterators then equal end().
  Iterator begin();
  End end() const { return End{}; }

  // Receives the StepScheduler's epoch and changes nothing. In NeMo the DataLoader never
  // forwards set_epoch to a batch sampler, so the reference's epoch comes from
  // consumed_samples alone, and so does Keel's. Honoring the scheduler's epoch would change
  // the stream where the two disagree, e.g. after resuming from a checkpoint taken on an
  // epoch's last batch (the scheduler stores the old epoch, the sampler has moved on).
  void SetEpoch(int64_t /*epoch*/) {}

  MegatronSamplerState State() const { return {consumed_samples_, epoch_, options_.seed}; }

  // Continues the stream saved by State() (of a sampler with the same options); the
  // random sampler adopts the state's seed. Errors: kInvalidArgument (nothing changes) when
  // consumed_samples or epoch is negative, consumed_samples is not at a micro-batch group
  // boundary of its epoch (the reference's assertion), or a sequential sampler's state has a
  // seed.
  [[nodiscard]] absl::Status LoadState(const MegatronSamplerState& state);

  const PretrainingSamplerOptions& options() const { return options_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  // The epoch of the pass last started (the reference's sampler.epoch); 0 before any.
  int64_t epoch() const { return epoch_; }

 protected:
  // `shuffles`: whether the sampler has a seed.
  MegatronSampler(const PretrainingSamplerOptions& options, bool shuffles);

  // Checks BaseMegatronSampler's rules (see the samplers' Create).
  [[nodiscard]] static absl::Status ValidateBase(const PretrainingSamplerOptions& options);

  // Samples (across ranks) in one epoch: consumed_samples modulo it is the position in the
  // current epoch. 0 if a pass yields nothing.
  virtual int64_t SamplesPerEpoch() const = 0;
  // Prepares a pass at consumed_samples_ and sets epoch_.
  virtual void StartPass() = 0;
  // Sets `batch` to the pass's next micro-batch and advances consumed_samples_; false at
  // the end of the pass.
  virtual bool NextMicroBatch(std::vector<int64_t>& batch) = 0;
  // Frees what the pass holds.
  virtual void EndPass() {}

  PretrainingSamplerOptions options_;
  const bool shuffles_;
  int64_t micro_batch_times_data_parallel_size_;
  int64_t consumed_samples_ = 0;
  int64_t epoch_ = 0;

 private:
  // Numbers passes so that an iterator of an ended pass is at end().
  uint64_t pass_ = 0;
  std::vector<int64_t> batch_;
};

// Input iterator over one pass; *it is valid until ++it.
class MegatronSampler::Iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = std::vector<int64_t>;
  using difference_type = std::ptrdiff_t;
  using pointer = const std::vector<int64_t>*;
  using reference = const std::vector<int64_t>&;

  reference operator*() const { return sampler_->batch_; }
  pointer operator->() const { return &sampler_->batch_; }
  // Moves to the next micro-batch (consuming it) or to end().
  Iterator& operator++();
  bool operator==(End) const { return sampler_ == nullptr || sampler_->pass_ != pass_; }
  bool operator!=(End end) const { return !(*this == end); }

 private:
  friend class MegatronSampler;
  Iterator(MegatronSampler* sampler, uint64_t pass) : sampler_(sampler), pass_(pass) {}

  MegatronSampler* sampler_;
  uint64_t pass_;
};

// MegatronPretrainingSampler: indices 0 .. total_samples-1 in order, in groups of
// micro_batch_size × data_parallel_size; rank r gets slice [r·mbs, (r+1)·mbs) of each group.
// The last, incomplete group is dropped (drop_last) or sliced likewise, so later ranks may
// get a short or empty micro-batch; with pad_samples_to_global_batch_size (and drop_last =
// false) the indices continue with -1, -2, ... up to a whole number of global batches.
//
// size() is the reference's len: with global_batch_size, whole global batches (rounded down
// with drop_last, up without) × micro-batches per global batch, which drops micro-batches
// that a pass does yield when drop_last; without it, ceil(total_samples / (mbs × dp)) even
// when drop_last drops the partial group. Every pass is the same; consumed_samples (a Keel
// addition: NeMo's sequential sampler always starts at 0) positions a resumed pass.
class MegatronPretrainingSampler : public MegatronSampler {
 public:
  // Errors: kInvalidArgument for total_samples <= 0, micro_batch_size <= 0,
  // data_parallel_size <= 0, a data_parallel_rank outside [0, data_parallel_size),
  // global_batch_size <= 0 or not divisible by micro_batch_size × data_parallel_size,
  // pad_samples_to_global_batch_size without global_batch_size (the reference's checks, in
  // its order; it accepts a non-positive global_batch_size and then divides by zero or
  // computes a meaningless len), a non-zero seed or a kFeistel permutation (they belong to
  // the random sampler), or sizes whose sum overflows int64.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MegatronPretrainingSampler>> Create(
      const PretrainingSamplerOptions& options);

  int64_t size() const override;
  int64_t NumMicroBatches() const override;

 protected:
  int64_t SamplesPerEpoch() const override { return samples_per_epoch_; }
  void StartPass() override;
  bool NextMicroBatch(std::vector<int64_t>& batch) override;

 private:
  explicit MegatronPretrainingSampler(const PretrainingSamplerOptions& options);

  // Indices a pass walks through: total_samples rounded down to whole groups (drop_last),
  // or up to whole global batches (padding), or total_samples.
  int64_t samples_per_epoch_ = 0;
  // The position in the pass of the next group.
  int64_t position_ = 0;
};

// MegatronPretrainingRandomSampler: rank r owns the bucket [r·B, (r+1)·B) with B =
// (total_samples / (mbs × dp))·mbs, which each epoch visits in a fresh order (see
// RandomPermutation) and yields in micro-batches of mbs; the total_samples mod (mbs × dp)
// trailing samples are never used. The epoch and the position in it come from
// consumed_samples, which grows by mbs × dp per micro-batch yielded, so a pass abandoned
// mid-epoch is continued by the next one, and a pass runs to the end of its epoch only.
//
// Resumed with another data-parallel size dp' at consumed_samples C, as the reference does:
// the epoch is C / A' and the position P = C mod A' (A': total_samples rounded down to whole
// groups of mbs × dp'), and each new rank r yields positions [P / dp', B') of its new bucket
// [r·B', (r+1)·B') in that epoch's order. The samples served before the change came from the
// old buckets and orders, so in the rest of this epoch a sample already served can be served
// again, and one not yet served can be left out; the epochs after are whole again.
//
// size() is the reference's len for the rest of the current epoch: with global_batch_size,
// whole global batches (rounded down with drop_last, up without) × micro-batches per global
// batch; without it, one fewer than NumMicroBatches() when drop_last = false.
class MegatronPretrainingRandomSampler : public MegatronSampler {
 public:
  // Errors: kInvalidArgument for the sequential sampler's base rules (except seed and
  // permutation), then, as the reference, pad_samples_to_global_batch_size, and drop_last =
  // false unless micro_batch_size × data_parallel_size = 1; and (where the reference divides
  // by zero later) total_samples < micro_batch_size × data_parallel_size.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MegatronPretrainingRandomSampler>> Create(
      const PretrainingSamplerOptions& options);
  ~MegatronPretrainingRandomSampler() override;

  int64_t size() const override;
  int64_t NumMicroBatches() const override;

  // The rank's bucket size B: indices in a full epoch of this rank.
  int64_t bucket_size() const { return bucket_size_; }

 protected:
  int64_t SamplesPerEpoch() const override { return active_total_samples_; }
  void StartPass() override;
  bool NextMicroBatch(std::vector<int64_t>& batch) override;
  void EndPass() override;

 private:
  explicit MegatronPretrainingRandomSampler(const PretrainingSamplerOptions& options);

  // Samples per epoch across ranks: total_samples rounded down to whole groups.
  int64_t active_total_samples_ = 0;
  int64_t bucket_size_ = 0;
  // The pass: position in the epoch's bucket order, and that order (kRandperm: a tensor;
  // kFeistel: a function).
  int64_t bucket_position_ = 0;
  at::Tensor permutation_;
  std::unique_ptr<internal::FeistelPermutation> feistel_;
};

// Keel's random sampler for elastic runs (shuffle_scope "global"): each epoch e is one
// permutation of all total_samples (seeded with seed + e, see RandomPermutation), of which the
// first E = (total_samples / global_batch_size)·global_batch_size positions are the epoch; in
// every group of mbs × dp positions, rank r takes [r·mbs, (r+1)·mbs). consumed_samples alone
// positions the stream, and neither E nor the samples of a global batch depend on the
// data-parallel size: a run resumed on any world size sees the same samples at every step, and
// each epoch serves each of its E samples exactly once. The other total_samples - E samples of
// the permutation wait for a later epoch's order. With "randperm", every rank holds the
// permutation of all total_samples (8 bytes each) during a pass; "feistel" holds none. size()
// is the rest of the epoch in this rank's micro-batches.
class GlobalRandomSampler : public MegatronSampler {
 public:
  // Errors: kInvalidArgument for the sequential sampler's base rules (except seed and
  // permutation), no global_batch_size, or total_samples < global_batch_size.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GlobalRandomSampler>> Create(
      const PretrainingSamplerOptions& options);
  ~GlobalRandomSampler() override;

  int64_t size() const override { return NumMicroBatches(); }
  int64_t NumMicroBatches() const override;

 protected:
  int64_t SamplesPerEpoch() const override { return epoch_samples_; }
  void StartPass() override;
  bool NextMicroBatch(std::vector<int64_t>& batch) override;
  void EndPass() override;

 private:
  explicit GlobalRandomSampler(const PretrainingSamplerOptions& options);

  // E: whole global batches of the dataset.
  int64_t epoch_samples_ = 0;
  // The pass: position in the epoch's order of the next micro-batch group, and that order.
  int64_t position_ = 0;
  at::Tensor permutation_;
  std::unique_ptr<internal::FeistelPermutation> feistel_;
};

// create_megatron_sampler(dataset_len, ..., rank, world_size), i.e. MegatronSamplerConfig
// .build: a MegatronPretrainingSampler for "single"; for "cyclic", a
// MegatronPretrainingRandomSampler that, as the reference, ignores global_batch_size and
// pad_samples_to_global_batch_size and uses seed 0, or with shuffle_scope "global" a
// GlobalRandomSampler (seed 0, global_batch_size required). Errors: the samplers'
// (kInvalidArgument); kInvalidArgument for "single" with a random_permutation or shuffle_scope
// other than the default (the sequential sampler shuffles nothing).
[[nodiscard]] absl::StatusOr<std::unique_ptr<MegatronSampler>> CreateMegatronSampler(
    const MegatronSamplerOptions& options, int64_t dataset_len, int64_t rank, int64_t world_size);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_MEGATRON_SAMPLER_H_
