#include "tools/recipe/lora.h"

#include <memory>

#include "base/status.h"
#include "models/registry.h"
#include "parallel/parameters.h"
#include "peft/lora_adapter.h"
#include "tools/recipe/seeds.h"
#include "torch/utils.h"

namespace keel::tools::recipe {

absl::StatusOr<std::vector<peft::LinearModule>> AdaptedModules(const models::ModelOptions& model,
                                                               const peft::LoraOptions& lora) {
  std::shared_ptr<models::LanguageModel> one_rank;
  {
    const parallel::MetaParameters meta;
    one_rank = models::BuildLanguageModel(model, {});
  }
  return peft::SelectLinearModules(*one_rank, lora);
}

// The tag of the adapters' stream of draws among the run's (DerivedSeed).
constexpr int64_t kAdapterStream = 43;

absl::Status AttachAdapters(torch::nn::Module& model, const models::ModelOptions& options,
                            const peft::LoraOptions& lora, int64_t seed) {
  KEEL_ASSIGN_OR_RETURN(const std::vector<peft::LinearModule> modules,
                        AdaptedModules(options, lora));
  torch::manual_seed(DerivedSeed(seed, {kAdapterStream}));
  return peft::AttachLoraAdapters(model, modules, lora);
}

}  // namespace keel::tools::recipe
