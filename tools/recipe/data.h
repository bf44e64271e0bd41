// The data of a training run: GPT windows of a Megatron indexed dataset (data.prefix, or the
// default corpus that rank 0 prepares into <run_dir>/data), split into training and validation
// windows, and the Megatron sampler that slices the training windows across ranks.
//
//   KEEL_ASSIGN_OR_RETURN(TrainData data, OpenTrainData(options, runtime));
//   KEEL_ASSIGN_OR_RETURN(at::Tensor batch, data.splits.Batch(indices, /*validation=*/false));
#ifndef KEEL_TOOLS_RECIPE_DATA_H_
#define KEEL_TOOLS_RECIPE_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "sampling/gpt_dataset.h"
#include "sampling/megatron_sampler.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

// The GPT windows split into training and validation samples: with n =
// data.validation_every_n_samples, every n-th window validates (none for n = 0).
class Splits {
 public:
  Splits(sampling::GptDataset dataset, int64_t every_n)
      : dataset_(std::move(dataset)), every_n_(every_n) {}

  int64_t train_size() const { return dataset_.size() - val_size(); }
  int64_t val_size() const { return every_n_ == 0 ? 0 : dataset_.size() / every_n_; }

  // Samples [count, sequence_length + 1] for the given split indices (negative ones, padding,
  // are skipped); an undefined tensor when none is left. Errors: as GptDataset::Sample.
  [[nodiscard]] absl::StatusOr<at::Tensor> Batch(const std::vector<int64_t>& indices,
                                                 bool validation) const;

 private:
  int64_t TrainIndex(int64_t j) const;
  int64_t ValIndex(int64_t k) const { return k * every_n_ + every_n_ - 1; }

  sampling::GptDataset dataset_;
  int64_t every_n_;
};

// The training windows the sampler draws from: with sampler.drop_last, the split cut to whole
// global batches (the windows past the last one never make a step). That keeps every epoch,
// and so the data of every step, the same on any number of ranks: the reference samplers
// otherwise drop the tail of whole micro-batch groups, whose size depends on the world size.
int64_t SampledWindows(const TrainOptions& options, const Splits& splits);

struct TrainData {
  // The dataset prefix trained on.
  std::string prefix;
  Splits splits;
  std::unique_ptr<sampling::MegatronSampler> sampler;
};

// Opens the run's data; rank 0 prepares the default corpus first when data.prefix is empty and
// <run_dir>/data holds none, while the other ranks wait for its status.
// Collective: over runtime.control_group. Errors: kNotFound for a missing dataset or default
// corpus; kDataLoss for a corrupt one (or its .tokenizer.json); kInvalidArgument when
// model.vocab_size is smaller than the vocabulary recorded beside the dataset (TokenizerInfo),
// and the sampler's (too few windows).
[[nodiscard]] absl::StatusOr<TrainData> OpenTrainData(const TrainOptions& options,
                                                      const TrainRuntime& runtime);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_DATA_H_
