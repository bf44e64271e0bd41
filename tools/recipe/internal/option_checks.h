// What the readers of the trainer's options share within tools/recipe: the form of a
// refusal, the bounds on sizes and parameters, and the checks options.cc calls from
// options_model.cc (the model section) and options_parallel.cc (the layout's geometry).
#ifndef KEEL_TOOLS_RECIPE_INTERNAL_OPTION_CHECKS_H_
#define KEEL_TOOLS_RECIPE_INTERNAL_OPTION_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "models/model_options.h"
#include "tools/recipe/config.pb.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {

// `field` (`value`) `allowed`, unless ok. `value` an integer or a double.
template <typename Number>
absl::Status Require(bool ok, absl::string_view field, Number value, absl::string_view allowed) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " (", value, ") ", allowed));
}

// The largest size or count a configuration takes: a model's largest size, which keeps
// products of a few of them exact in 64 bits.
inline constexpr int64_t kMaxCount = models::kMaxSize;

// "is beyond kMaxCount, ...": what Require says of a size or count above it.
std::string TooLarge();

// LoRA adapters of rank `dim` on the model of `m` count at most 2^53; an error naming
// peft.dim otherwise.
absl::Status CheckAdapterCount(int64_t dim, const models::ModelOptions& m);

// The model section (and a pretrained directory's config.json) into options.model, checked as
// CheckModelValues does.
absl::Status ReadModel(const TrainConfig& config, TrainOptions& options);

// The model against the layout's sizes: the tensor-parallel split of heads and MLP, the
// pipeline stages' layers, the experts over expert parallelism.
absl::Status CheckModelParallelModel(const TrainOptions& options);

// Sequence parallelism: tensor parallelism, no experts, sequences that split evenly.
absl::Status CheckSequenceParallel(const TrainOptions& options);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_INTERNAL_OPTION_CHECKS_H_
