#include "tools/recipe/optimizer.h"

#include <utility>

#include "ATen/core/Tensor.h"
#include "optim/fused_adamw.h"
#include "torch/optim/adamw.h"

namespace keel::tools::recipe {
namespace {

// AdamW with the run's options, over whatever the data-parallel optimizer steps: one
// multi-tensor kernel per step (optim::FusedAdamW) when `fused`, else torch::optim::AdamW's
// loop over the parameters.
optim::OptimizerFactory AdamW(const OptimizerOptions& o, bool fused) {
  return [o, fused](const std::vector<gradients::NamedParameter>& params)
             -> std::unique_ptr<torch::optim::Optimizer> {
    std::vector<at::Tensor> tensors;
    for (const gradients::NamedParameter& p : params) tensors.push_back(p.param);
    const auto options = torch::optim::AdamWOptions(o.lr)
                             .betas({o.beta1, o.beta2})
                             .eps(o.eps)
                             .weight_decay(o.weight_decay);
    if (!fused) return std::make_unique<torch::optim::AdamW>(tensors, options);
    // ReadOptions refused a LibTorch without the kernel; parameters and their row shards are
    // contiguous floating-point tensors.
    absl::StatusOr<std::unique_ptr<optim::FusedAdamW>> adamw =
        optim::FusedAdamW::Create(tensors, options);
    TORCH_INTERNAL_ASSERT(adamw.ok(), adamw.status().ToString());
    return *std::move(adamw);
  };
}

}  // namespace

bool UsesFusedAdamW(const OptimizerOptions& options, const at::Device& device) {
  return options.fused.value_or(device.is_cuda());
}

absl::StatusOr<std::unique_ptr<optim::DataParallelOptimizer>> BuildOptimizer(
    std::vector<gradients::NamedParameter> parameters, const TrainOptions& options,
    const TrainRuntime& runtime, const std::string& expert_dim) {
  optim::DataParallelOptimizerOptions optimizer_options;
  optimizer_options.use_distributed_optimizer = options.distributed.use_distributed_optimizer;
  optimizer_options.clip.pp_group = runtime.pipeline_group();
  optimizer_options.clip.device = runtime.device;
  optimizer_options.expert_dim_name = expert_dim;
  optimizer_options.expert_data_parallel_group = runtime.expert_data_group();
  if (options.bf16) {
    // Megatron's bf16: float32 main parameters, main gradients in float32 unless told.
    optimizer_options.sync.main_grad_dtype =
        MainGradientsInFloat32(options.distributed) ? at::kFloat : at::kBFloat16;
    optimizer_options.sync.gradient_accumulation_fusion =
        FusesGradientAccumulation(options.distributed);
  }
  return optim::DataParallelOptimizer::Create(
      std::move(parameters), runtime.gradient_group(),
      AdamW(options.optimizer, UsesFusedAdamW(options.optimizer, runtime.device)),
      optimizer_options);
}

}  // namespace keel::tools::recipe
