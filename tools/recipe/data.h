// The data of a training run: GPT windows of a Megatron indexed dataset (data.prefix, or the
// default corpus that rank 0 prepares into <run_dir>/data) split into training and validation
// windows, Megatron's GPT datasets of data.paths (megatron_data.h), or the conversations of
// data.format "sft" (sft_data.h); and the Megatron sampler that slices the training samples
// across ranks.
//
//   KEEL_ASSIGN_OR_RETURN(TrainData data, OpenTrainData(options, runtime));
//   KEEL_ASSIGN_OR_RETURN(TokenBatch batch, data.splits.Batch(indices, /*validation=*/false));
#ifndef KEEL_TOOLS_RECIPE_DATA_H_
#define KEEL_TOOLS_RECIPE_DATA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "base/attention.h"
#include "sampling/fixed_window_dataset.h"
#include "sampling/megatron_sampler.h"
#include "tools/recipe/megatron_data.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"
#include "tools/recipe/sft_data.h"

namespace keel::tools::recipe {

// One batch of samples: inputs and labels (the next tokens), the loss mask, and the sequences
// packed into its rows.
struct TokenBatch {
  // [n, L] int64; undefined when the batch is empty.
  at::Tensor inputs;
  at::Tensor labels;
  // [n, L] float, 1 where a label counts; undefined: every label counts.
  at::Tensor loss_mask;
  // Packed conversations (packed_sequence.packed_sequence_size); undefined: one sample a row.
  base::PackedSequences packed;

  bool defined() const { return inputs.defined(); }
  TokenBatch To(const at::Device& device) const;
};

// A run's samples split into training and validation: the GPT windows of data.prefix (or the
// default corpus) in file order, every n-th (n = data.validation_every_n_samples) validating,
// or Megatron's GPT datasets of data.paths (MegatronData).
class Splits {
 public:
  Splits(sampling::FixedWindowDataset dataset, int64_t every_n)
      : windows_(std::move(dataset)), every_n_(every_n) {}
  explicit Splits(std::unique_ptr<MegatronData> megatron);
  explicit Splits(std::unique_ptr<SftData> sft);
  Splits(Splits&&) noexcept;
  Splits& operator=(Splits&&) noexcept;
  ~Splits();

  int64_t train_size() const;
  int64_t val_size() const;

  // The training windows of `windows` windows with every n-th validating (n = 0: none).
  static int64_t TrainWindows(int64_t windows, int64_t every_n);

  // The samples of the given split indices (negative ones, padding, are skipped); an
  // undefined batch when none is left. Windows have all labels counted; Megatron's samples and
  // conversations carry their loss masks. Not thread-safe. Errors: as
  // FixedWindowDataset::Sample, MegatronData::Fill and SftData::Fill.
  [[nodiscard]] absl::StatusOr<TokenBatch> Batch(const std::vector<int64_t>& indices,
                                                 bool validation) const;

  // The Megatron datasets of data.paths; nullptr otherwise.
  MegatronData* megatron() const { return megatron_.get(); }
  // The conversations of data.format "sft"; nullptr otherwise.
  const SftData* sft() const { return sft_.get(); }

 private:
  int64_t TrainIndex(int64_t j) const;
  int64_t ValIndex(int64_t k) const { return k * every_n_ + every_n_ - 1; }
  absl::StatusOr<TokenBatch> WindowBatch(const std::vector<int64_t>& indices,
                                         bool validation) const;

  std::optional<sampling::FixedWindowDataset> windows_;
  int64_t every_n_ = 0;
  std::unique_ptr<MegatronData> megatron_;
  std::unique_ptr<SftData> sft_;
};

// What a sample of `splits` is, in messages: "windows", "conversations" or "packs" (of
// conversations), and its tokens.
struct SampleShape {
  const char* noun;
  int64_t tokens;
};
SampleShape ShapeOf(const TrainOptions& options, const Splits& splits);

// The training windows the sampler draws from: with sampler.drop_last, the split cut to whole
// global batches (the windows past the last one never make a step). That keeps every epoch,
// and so the data of every step, the same on any number of ranks: the reference samplers
// otherwise drop the tail of whole micro-batch groups, whose size depends on the world size.
int64_t SampledWindows(const TrainOptions& options, const Splits& splits);

struct TrainData {
  // The dataset prefix trained on (data.paths for Megatron's datasets).
  std::string prefix;
  Splits splits;
  std::unique_ptr<sampling::MegatronSampler> sampler;
};

// Opens the run's data; rank 0 prepares the default corpus first when data.prefix is empty and
// <run_dir>/data holds none, while the other ranks wait for its status (RunOnRankZero); with
// data.paths, Megatron's datasets (MegatronData::Open; `plan_only` builds no index, for dry
// runs). A rank that fails to open what rank 0 prepared fails every rank with its error
// ("rank <r>: ..."). Collective: over runtime.control_group() and the store. Errors: kNotFound for
// a missing dataset or default corpus; kDataLoss for a corrupt one (or its .tokenizer.json);
// kInvalidArgument when model.vocab_size is smaller than the vocabulary recorded beside the dataset
// (TokenizerInfo), MegatronData::Open's, and the sampler's (too few windows).
[[nodiscard]] absl::StatusOr<TrainData> OpenTrainData(const TrainOptions& options,
                                                      const TrainRuntime& runtime,
                                                      bool plan_only = false);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_DATA_H_
