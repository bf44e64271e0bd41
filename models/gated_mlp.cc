#include "models/gated_mlp.h"

#include <vector>

#include "ATen/ATen.h"
#include "torch/csrc/autograd/custom_function.h"

namespace keel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SwiGluFunction : torch::autograd::Function<SwiGluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return at::silu(gate) * up;
  }

  // As autograd's MulBackward0 and SiluBackward0, the same products (x·y is y·x in IEEE
  // arithmetic), each gradient computed in place of its first product: no tensor beyond the two
  // gradients is allocated.
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor& grad = grad_output[0];
    at::Tensor grad_gate, grad_up;
    if (ctx->needs_input_grad(0)) {
      grad_gate = grad * up;
      at::silu_backward_out(grad_gate, grad_gate, gate);
    }
    if (ctx->needs_input_grad(1)) grad_up = at::silu(gate).mul_(grad);
    return {grad_gate, grad_up};
  }
};

}  // namespace

at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  return SwiGluFunction::apply(gate, up);
}

GatedMlpImpl::GatedMlpImpl(int64_t hidden_size, int64_t intermediate_size, c10d::ProcessGroup* tp,
                           bool sequence_parallel)
    : gate_proj_(register_module(
          "gate_proj", parallel::ColumnParallelLinear(hidden_size, intermediate_size, tp,
                                                      /*bias=*/false, /*gather_output=*/false,
                                                      sequence_parallel))),
      up_proj_(register_module(
          "up_proj", parallel::ColumnParallelLinear(hidden_size, intermediate_size, tp,
                                                    /*bias=*/false, /*gather_output=*/false,
                                                    sequence_parallel))),
      down_proj_(register_module(
          "down_proj", parallel::RowParallelLinear(intermediate_size, hidden_size, tp,
                                                   /*bias=*/false, /*input_is_parallel=*/true,
                                                   sequence_parallel))) {}

at::Tensor GatedMlpImpl::forward(const at::Tensor& x) {
  // gate and up from one product (and under sequence parallelism one gather of x).
  const std::vector<at::Tensor> gate_up =
      parallel::ColumnParallelLinearImpl::ForwardStacked(x, {gate_proj_.get(), up_proj_.get()});
  return down_proj_->forward(SwiGlu(gate_up[0], gate_up[1]));
}

}  // namespace keel::models
