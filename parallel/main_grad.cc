#include "parallel/main_grad.h"

#include <memory>

#include "ATen/ops/addmm.h"
#include "ATen/ops/mm.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/variable.h"

namespace keel::parallel {

MainGrad* MainGradOf(const at::Tensor& weight) {
  if (!weight.defined() || !weight.requires_grad() || !weight.is_leaf()) return nullptr;
  const std::shared_ptr<torch::autograd::Node> accumulator =
      torch::autograd::impl::try_get_grad_accumulator(weight);
  if (accumulator == nullptr) return nullptr;
  for (const std::unique_ptr<torch::autograd::FunctionPostHook>& hook :
       accumulator->post_hooks()) {
    if (auto* main = dynamic_cast<MainGrad*>(hook.get())) return main;
  }
  return nullptr;
}

void AddProductInto(at::Tensor& rows, const at::Tensor& grad_output, const at::Tensor& input,
                    bool overwrite) {
  const at::Tensor transposed = grad_output.t();
  const at::ScalarType inputs = grad_output.scalar_type();
  if (rows.is_cuda() && rows.scalar_type() == at::kFloat &&
      (inputs == at::kBFloat16 || inputs == at::kHalf)) {
    if (overwrite) {
      at::mm_out(rows, transposed, input, at::kFloat);
    } else {
      at::addmm_out(rows, rows, transposed, input, at::kFloat);
    }
    return;
  }
  const at::Tensor product = at::mm(transposed, input);
  if (overwrite) {
    rows.copy_(product);
  } else {
    rows.add_(product);
  }
}

}  // namespace keel::parallel
