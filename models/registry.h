// The model a configuration names, built for this rank (its pipeline stage, its slices of the
// tensor- and expert-parallel layers), and what --dry_run counts of it without building it.
//
//   torch::manual_seed(seed);
//   std::shared_ptr<LanguageModel> model = BuildLanguageModel(options, groups);
#ifndef KEEL_MODELS_REGISTRY_H_
#define KEEL_MODELS_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "models/language_model.h"
#include "models/model_options.h"
#include "parallel/mesh_layout.h"

namespace keel::models {

// This rank's stage of the model of `options`, its weights drawn from the default generator
// (the same at every layout: the one-rank model's, sliced). Requires: options the trainer's
// configuration checks accepted, groups of the sizes they were checked against.
std::shared_ptr<LanguageModel> BuildLanguageModel(const ModelOptions& options,
                                                  const ModelGroups& groups);

// The parameters one rank of stage `stage` holds at the sizes of `parallel`, counted from the
// shapes the model registers. Requires: as BuildLanguageModel.
StageParameters CountStageParameters(const ModelOptions& options,
                                     const parallel::ModelParallelOptions& parallel, int64_t stage);

// One line naming the family and its sizes ("llama: 16 layers, hidden 2048, 32 heads of 64 over
// 8 key-value groups, SwiGLU MLP 8192, vocabulary 128256, RoPE base 500000 with llama3 scaling
// (factor 32), tied output; 1235814400 parameters"), for --dry_run.
std::string DescribeModel(const ModelOptions& options);

}  // namespace keel::models

#endif  // KEEL_MODELS_REGISTRY_H_
