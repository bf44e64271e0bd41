// AdamW whose step is one multi-tensor kernel per device and dtype: ATen's _fused_adamw_, what
// torch.optim.AdamW(fused=True) runs (torch/optim/adamw.py, _fused_adamw), with each
// parameter's step count also kept on its device as the kernel needs it, so a step launches a
// few kernels and never waits for the host. In everything else it is a torch::optim::AdamW: the
// same options and param groups, and the same AdamWParamState per parameter (exp_avg,
// exp_avg_sq, max_exp_avg_sq, a host step count), so the learning-rate schedule, the
// distributed optimizer and checkpoints handle it as AdamW, and a state loaded into it (or
// cleared) is what its next step continues from.
//
//   KEEL_ASSIGN_OR_RETURN(std::unique_ptr<FusedAdamW> adamw,
//                         FusedAdamW::Create(params, torch::optim::AdamWOptions(3e-4)));
//   loss.backward();
//   adamw->step();
#ifndef KEEL_OPTIM_FUSED_ADAMW_H_
#define KEEL_OPTIM_FUSED_ADAMW_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "torch/optim/adamw.h"

namespace keel::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  // AdamW over `params` with `defaults`. Errors: kInvalidArgument for a parameter that is not
  // a contiguous floating-point tensor (the kernel reads each one as a flat array), naming its
  // position.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FusedAdamW>> Create(
      std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FusedAdamW>> Create(
      std::vector<torch::optim::OptimizerParamGroup> groups,
      torch::optim::AdamWOptions defaults = {});

  // torch::optim::AdamW's step over the parameters that have a gradient (a parameter without
  // one keeps its weights and state): per param group, one _fused_adamw_ per device and dtype.
  // Equal to AdamW's per-parameter step up to the rounding of the fused kernel (it evaluates
  // the same formulas in another order; on the CPU an element's rounding can also depend on
  // where it falls in its tensor, vectorized body or tail, so row shards step to float32
  // rounding of their whole parameter). Throws c10::Error as AdamW's step does (a sparse
  // gradient, a gradient of another device or dtype than its parameter).
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
                      torch::optim::AdamWOptions defaults);

  // A parameter's step count on its device (float32, as the kernel reads it), and the host
  // count it holds: when the parameter's AdamWParamState says otherwise (a loaded or cleared
  // state), the device count is set from it before the step.
  struct DeviceStep {
    at::Tensor count;
    int64_t value = 0;
  };
  std::unordered_map<const c10::TensorImpl*, DeviceStep> device_steps_;
};

}  // namespace keel::optim

#endif  // KEEL_OPTIM_FUSED_ADAMW_H_
