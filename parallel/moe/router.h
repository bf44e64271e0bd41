// The router of a mixture-of-experts layer after Megatron-Core's transformer/moe/router.py
// (TopKRouter) and moe_utils.py: each token's k experts and their weights, and the Switch
// Transformer load-balancing loss, whose gradient joins the backward pass as Megatron's
// MoEAuxLossAutoScaler makes it.
//
//   keel::parallel::RouterOptions options;  // Megatron's TransformerConfig fields, by name
//   options.num_moe_experts = 8;
//   options.moe_router_topk = 2;
//   keel::parallel::TopKRouter router(hidden_size, options);
//   keel::parallel::Routing routing = router->forward(tokens);  // tokens: [T, hidden]
//   output = keel::parallel::AttachAuxLoss(output, routing.aux_loss, 1.0 / num_micro_batches);
#ifndef KEEL_PARALLEL_MOE_ROUTER_H_
#define KEEL_PARALLEL_MOE_ROUTER_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace keel::parallel {

struct RouterOptions {
  // Experts of the layer. Default: 8.
  int64_t num_moe_experts = 8;
  // Experts each token goes to; 1 <= k <= num_moe_experts. Default: 2.
  int64_t moe_router_topk = 2;
  // The weights: a softmax over all experts, then the top k of it (true), or the top k logits,
  // then a softmax over those k (false, Megatron's default). Default: false.
  bool moe_router_pre_softmax = false;
  // The load-balancing loss's coefficient; 0: none. Default: 0.
  double moe_aux_loss_coeff = 0.0;
};

// One micro-batch's routing of T tokens.
struct Routing {
  // Each token's weight for each of its experts, [T, k], float32.
  at::Tensor probs;
  // Each token's experts, [T, k], int64.
  at::Tensor indices;
  // Tokens routed to each expert (a token counts once per expert it goes to), [E], int64.
  at::Tensor tokens_per_expert;
  // switch_load_balancing_loss_func over the micro-batch: E x coeff / (k x T^2) x
  // sum_e(tokens_e x sum_t softmax(logits)_te), a 0-d tensor that requires grad; 0 without a
  // coefficient.
  at::Tensor aux_loss;
};

class TopKRouterImpl : public torch::nn::Module {
 public:
  // A router for tokens of `hidden_size`; its weight [E, hidden_size] starts at zeros (a model
  // copies its weights in). Throws c10::Error naming both numbers unless 1 <= moe_router_topk
  // <= num_moe_experts.
  TopKRouterImpl(int64_t hidden_size, const RouterOptions& options);

  // Routes `tokens` ([T, hidden_size]); the logits in float32 as Megatron's router computes
  // them.
  Routing forward(const at::Tensor& tokens);

  const RouterOptions& options() const { return options_; }

 private:
  RouterOptions options_;
  at::Tensor weight_;
};

TORCH_MODULE(TopKRouter);

// MoEAuxLossAutoScaler: `output` unchanged, and in the backward pass `aux_loss` receives the
// gradient `scale` (the weight the main loss gives this micro-batch), so the load-balancing
// loss trains the router without being added to the reported loss.
at::Tensor AttachAuxLoss(const at::Tensor& output, const at::Tensor& aux_loss, double scale);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_MOE_ROUTER_H_
