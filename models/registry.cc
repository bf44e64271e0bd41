#include "models/registry.h"

#include <memory>

namespace keel::models {

std::shared_ptr<LanguageModel> BuildLanguageModel(const ModelOptions& options,
                                                  const ModelGroups& groups) {
  return std::make_shared<GptImpl>(options, groups);
}

StageParameters CountStageParameters(const ModelOptions& options,
                                     const parallel::ModelParallelOptions& parallel,
                                     int64_t stage) {
  return CountGptStageParameters(options, parallel, stage);
}

}  // namespace keel::models
