#include "parallel/tensor_parallel/cross_entropy.h"

#include <cstdint>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallel : torch::autograd::Function<VocabParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t encoded_group) {
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(encoded_group);
    const int64_t vocab = logits.size(-1);
    const int64_t rank = base::GroupRank(group);
    const at::Tensor rows = logits.reshape({-1, vocab});
    const at::Tensor flat_target = target.reshape({-1});

    // Shifted by the maximum over the whole vocabulary, for exp.
    at::Tensor max = std::get<0>(rows.max(-1)).contiguous();
    AllReduceInPlace(max, group, /*max=*/true);
    const at::Tensor shifted = rows - max.unsqueeze(-1);

    // The target's logit, on the rank whose slice holds it (zero elsewhere), summed.
    const int64_t begin = rank * vocab;
    const at::Tensor outside = flat_target.lt(begin).logical_or(flat_target.ge(begin + vocab));
    const at::Tensor local_target = (flat_target - begin).masked_fill(outside, 0);
    at::Tensor predicted = shifted.gather(-1, local_target.unsqueeze(-1))
                               .squeeze(-1)
                               .masked_fill(outside, 0)
                               .contiguous();
    AllReduceInPlace(predicted, group);

    const at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(-1).contiguous();
    AllReduceInPlace(sum_exp, group);
    const at::Tensor loss = sum_exp.log() - predicted;

    ctx->save_for_backward({exp / sum_exp.unsqueeze(-1), local_target, outside});
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.view(target.sizes());
  }

  // d loss / d logits = softmax - one_hot(target), on this rank's slice.
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local_target = saved[1];
    const at::Tensor& outside = saved[2];
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(-1, local_target.unsqueeze(-1),
                      outside.logical_not().to(grad.scalar_type()).neg().unsqueeze(-1));
    grad.mul_(grad_output[0].reshape({-1}).unsqueeze(-1));
    return {grad.view(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor()};
  }
};

// The whole vocabulary on one rank: ATen's log-softmax, whose one fused pass replaces the
// maximum, the shift, the exponentials and their sum, and a gradient computed in place of the
// saved log-probabilities and written in the logits' dtype. About half the memory traffic of
// VocabParallel over [tokens, vocabulary], which dominates a large vocabulary's step.
struct WholeVocab : torch::autograd::Function<WholeVocab> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target) {
    const int64_t vocab = logits.size(-1);
    const at::Tensor log_probs = at::log_softmax(logits.reshape({-1, vocab}), -1, at::kFloat);
    const at::Tensor flat_target = target.reshape({-1, 1});
    const at::Tensor loss = log_probs.gather(-1, flat_target).neg();
    ctx->save_for_backward({log_probs, flat_target});
    ctx->saved_data["shape"] = logits.sizes().vec();
    ctx->saved_data["dtype"] = logits.scalar_type();
    return loss.view(target.sizes());
  }

  // softmax - one_hot(target), times the loss's gradient, from the saved log-probabilities
  // (which nothing reads after this backward).
  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor probs = saved[0];
    probs.exp_();
    probs.scatter_add_(-1, saved[1], at::full({1, 1}, -1.0, probs.options()).expand_as(saved[1]));
    at::Tensor grad = at::empty(ctx->saved_data["shape"].toIntVector(),
                                probs.options().dtype(ctx->saved_data["dtype"].toScalarType()));
    at::Tensor rows = grad.view(probs.sizes());
    at::mul_out(rows, probs, grad_output[0].reshape({-1, 1}));
    return {grad, at::Tensor()};
  }
};

}  // namespace

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     c10d::ProcessGroup* group) {
  if (base::GroupSize(group) == 1) return WholeVocab::apply(logits, target);
  return VocabParallel::apply(logits.to(at::kFloat), target, reinterpret_cast<intptr_t>(group));
}

}  // namespace keel::parallel
