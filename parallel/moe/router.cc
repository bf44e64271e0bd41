#include "parallel/moe/router.h"

#include <tuple>

#include "ATen/ATen.h"
#include "c10/util/Exception.h"
#include "parallel/parameters.h"
#include "torch/csrc/autograd/custom_function.h"

namespace keel::parallel {
namespace {

// Megatron's MoEAuxLossAutoScaler.
class AuxLossScaler : public torch::autograd::Function<AuxLossScaler> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& output,
                            const at::Tensor& aux_loss, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({aux_loss});
    return output.view_as(output);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor aux_loss = ctx->get_saved_variables()[0];
    return {grads[0], at::ones_like(aux_loss) * ctx->saved_data["scale"].toDouble(), at::Tensor()};
  }
};

}  // namespace

TopKRouterImpl::TopKRouterImpl(int64_t hidden_size, const RouterOptions& options)
    : options_(options) {
  TORCH_CHECK(options.moe_router_topk >= 1 && options.moe_router_topk <= options.num_moe_experts,
              "moe_router_topk (", options.moe_router_topk, ") must be in [1, num_moe_experts (",
              options.num_moe_experts, ")]");
  weight_ = register_parameter("weight", NewParameter({options.num_moe_experts, hidden_size}));
}

Routing TopKRouterImpl::forward(const at::Tensor& tokens) {
  const int64_t k = options_.moe_router_topk;
  const int64_t experts = options_.num_moe_experts;
  const at::Tensor logits = at::linear(tokens.to(at::kFloat), weight_.to(at::kFloat));
  Routing routing;
  if (options_.moe_router_pre_softmax) {
    std::tie(routing.probs, routing.indices) = at::topk(at::softmax(logits, -1), k, -1);
  } else {
    at::Tensor top_logits;
    std::tie(top_logits, routing.indices) = at::topk(logits, k, -1);
    routing.probs = at::softmax(top_logits, -1);
  }
  const at::Tensor routing_map =
      at::zeros({tokens.size(0), experts}, logits.options()).scatter(1, routing.indices, 1.0);
  routing.tokens_per_expert = routing_map.sum(0).to(at::kLong);
  // No coefficient, or no tokens (an expert-parallel rank's empty micro-batch: the formula
  // below would divide zero by zero): no load to balance.
  if (options_.moe_aux_loss_coeff == 0.0 || tokens.size(0) == 0) {
    routing.aux_loss = at::zeros({}, logits.options());
    return routing;
  }
  const double num_tokens = static_cast<double>(tokens.size(0));
  const at::Tensor scores_per_expert = at::softmax(logits, -1).sum(0);
  routing.aux_loss = (scores_per_expert * routing_map.sum(0)).sum() *
                     (static_cast<double>(experts) * options_.moe_aux_loss_coeff /
                      (static_cast<double>(k) * num_tokens * num_tokens));
  return routing;
}

at::Tensor AttachAuxLoss(const at::Tensor& output, const at::Tensor& aux_loss, double scale) {
  return AuxLossScaler::apply(output, aux_loss, scale);
}

}  // namespace keel::parallel
