// The trainer's optimizer: AdamW with the run's options (optimizer.*), one fused kernel a step
// on GPUs (optim::FusedAdamW) or LibTorch's loop over the parameters on the CPU, under the
// data-parallel optimizer (the gradient sync or, with distributed.use_distributed_optimizer,
// the sharded state; clipping over the parameters' layouts); with model.bf16, over float32
// main parameters and main gradients (distributed.grad_reduce_in_fp32).
//
//   KEEL_ASSIGN_OR_RETURN(std::unique_ptr<optim::DataParallelOptimizer> optimizer,
//                         BuildOptimizer(parameters, options, runtime, parallel::kExpertDim));
#ifndef KEEL_TOOLS_RECIPE_OPTIMIZER_H_
#define KEEL_TOOLS_RECIPE_OPTIMIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "gradients/parameters.h"
#include "optim/data_parallel_optimizer.h"
#include "tools/recipe/options.h"
#include "tools/recipe/runtime.h"

namespace keel::tools::recipe {

// optimizer.fused as the run takes it on `device`: unset, fused on GPUs.
bool UsesFusedAdamW(const OptimizerOptions& options, const at::Device& device);

// The optimizer over `parameters` (with their layouts; expert parameters are those whose layout
// has a dimension named `expert_dim`), averaging over runtime.gradient_group() (none on one
// data-parallel rank), clipping over runtime.pipeline_group() too. Collective: over
// runtime.gradient_group(). Errors: those of optim::DataParallelOptimizer::Create.
[[nodiscard]] absl::StatusOr<std::unique_ptr<optim::DataParallelOptimizer>> BuildOptimizer(
    std::vector<gradients::NamedParameter> parameters, const TrainOptions& options,
    const TrainRuntime& runtime, const std::string& expert_dim);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_OPTIMIZER_H_
