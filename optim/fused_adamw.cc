#include "optim/fused_adamw.h"

#include <map>
#include <tuple>
#include <utility>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"

namespace keel::optim {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;

// The tensors of one _fused_adamw_ call: one device and dtype of one param group.
struct Batch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  // The step counts that only need + 1 (the others were set from the host state).
  std::vector<at::Tensor> increments;
};

}  // namespace

FusedAdamW::FusedAdamW(std::vector<OptimizerParamGroup> groups, AdamWOptions defaults)
    : torch::optim::AdamW(std::move(groups), std::move(defaults)) {}

absl::StatusOr<std::unique_ptr<FusedAdamW>> FusedAdamW::Create(std::vector<at::Tensor> params,
                                                               AdamWOptions defaults) {
  return Create(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
                std::move(defaults));
}

absl::StatusOr<std::unique_ptr<FusedAdamW>> FusedAdamW::Create(
    std::vector<OptimizerParamGroup> groups, AdamWOptions defaults) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<at::Tensor>& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_floating_point() || !params[i].is_contiguous()) {
        return absl::InvalidArgumentError(
            absl::StrCat("param group ", g, ", parameter ", i, " (", params[i].toString(),
                         " of shape ", c10::str(params[i].sizes()),
                         "): the fused AdamW steps contiguous floating-point tensors only"));
      }
    }
  }
  return std::unique_ptr<FusedAdamW>(new FusedAdamW(std::move(groups), std::move(defaults)));
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& states = state();
  for (OptimizerParamGroup& group : param_groups()) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    std::map<std::tuple<std::string, at::ScalarType>, Batch> batches;
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(),
                  "AdamW does not support sparse gradients (the fused AdamW neither)");
      auto& slot = states[base::OptimizerStateKeyOf(p)];
      if (slot == nullptr) {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdamWParamState&>(*slot);
      Batch& batch = batches[{p.device().str(), p.scalar_type()}];
      DeviceStep& device_step = device_steps_[p.unsafeGetTensorImpl()];
      if (!device_step.count.defined()) {
        device_step.count = at::zeros({}, p.options().dtype(at::kFloat));
        device_step.value = 0;
      }
      if (device_step.value == state.step()) {
        batch.increments.push_back(device_step.count);
      } else {
        device_step.count.fill_(static_cast<double>(state.step() + 1));
      }
      state.step(state.step() + 1);
      device_step.value = state.step();
      batch.params.push_back(p);
      batch.grads.push_back(p.grad());
      batch.exp_avgs.push_back(state.exp_avg());
      batch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      batch.steps.push_back(device_step.count);
    }
    for (auto& [key, batch] : batches) {
      if (!batch.increments.empty()) at::_foreach_add_(batch.increments, 1.0);
      at::_fused_adamw_(batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs,
                        batch.max_exp_avg_sqs, batch.steps, options.lr(),
                        std::get<0>(options.betas()), std::get<1>(options.betas()),
                        options.weight_decay(), options.eps(), options.amsgrad(),
                        /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace keel::optim
