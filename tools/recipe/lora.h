// LoRA in the recipe: which linear layers of a model its peft section adapts, chosen on the
// one-rank model whatever the layout, and the adapters attached to a rank's part of the model as
// that one-rank model would draw them (peft/lora_adapter.h).
//
//   KEEL_RETURN_IF_ERROR(AttachAdapters(*model, options.model, *options.peft, options.seed));
//   // only the adapters require grad; the rest of the model is frozen
#ifndef KEEL_TOOLS_RECIPE_LORA_H_
#define KEEL_TOOLS_RECIPE_LORA_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/model_options.h"
#include "peft/lora_options.h"
#include "peft/module_matcher.h"
#include "torch/nn/module.h"

namespace keel::tools::recipe {

// The linear layers `lora` adapts in the one-rank model of `model` (built on the meta device:
// names and whole shapes, no memory), in its order. Errors: as peft::SelectLinearModules.
[[nodiscard]] absl::StatusOr<std::vector<peft::LinearModule>> AdaptedModules(
    const models::ModelOptions& model, const peft::LoraOptions& lora);

// Attaches `lora`'s adapters to `model`, this rank's part of the model of `options` (any stage,
// any tensor-parallel rank), and freezes the rest. Every A is drawn as the one-rank model draws
// it, from the default generator seeded here from `seed` (a stream of its own: the model's
// initialisation before it draws a padded vocabulary, whose size depends on the layout).
// Errors: as AdaptedModules and peft::AttachLoraAdapters.
[[nodiscard]] absl::Status AttachAdapters(torch::nn::Module& model,
                                          const models::ModelOptions& options,
                                          const peft::LoraOptions& lora, int64_t seed);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_LORA_H_
