#include "models/registry.h"

#include <memory>

#include "models/gpt.h"
#include "models/llama.h"

namespace keel::models {

std::shared_ptr<LanguageModel> BuildLanguageModel(const ModelOptions& options,
                                                  const ModelGroups& groups) {
  if (options.family == ModelFamily::kGpt) return std::make_shared<GptImpl>(options, groups);
  return std::make_shared<LlamaImpl>(options, groups);
}

StageParameters CountStageParameters(const ModelOptions& options,
                                     const parallel::ModelParallelOptions& parallel,
                                     int64_t stage) {
  if (options.family == ModelFamily::kGpt) return CountGptStageParameters(options, parallel, stage);
  return CountLlamaStageParameters(options, parallel, stage);
}

}  // namespace keel::models
