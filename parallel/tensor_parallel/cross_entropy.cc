#include "parallel/tensor_parallel/cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/main_grad.h"
#include "parallel/tensor_parallel/internal/vocab_slice.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using internal::SliceLogNormaliser;
using internal::VocabSlice;

// The whole vocabulary's log-normalisers and target logits from each rank's slice's, in two
// all-reduces: the largest slice log-normaliser M, then M + log(sum of exp(lse - M)) and the
// target logits' sum (one slice holds the target, the others give 0). Megatron reduces the
// maximum logit, the target's and the sum of exponentials: three.
void OverGroup(SliceLogNormaliser& slice, c10d::ProcessGroup* group) {
  if (base::GroupSize(group) == 1) return;
  at::Tensor max = slice.lse.clone();
  AllReduceInPlace(max, group, /*max=*/true);
  at::Tensor sums = at::stack({(slice.lse - max).exp_(), slice.target_logit});
  AllReduceInPlace(sums, group);
  slice.lse = sums[0].log().add_(max);
  slice.target_logit = sums[1];
}

// This rank's slice of a vocabulary split over `group`, its `columns` entries all real.
VocabSlice SliceOf(c10d::ProcessGroup* group, int64_t columns) {
  return {base::GroupRank(group) * columns, columns};
}

// The loss over each rank's slice of the logits: keeps the logits in their dtype and each row's
// float32 log-normaliser; backward computes softmax - one_hot(target) from them.
struct VocabParallel : torch::autograd::Function<VocabParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t encoded_group) {
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(encoded_group);
    const int64_t vocab = logits.size(-1);
    const at::Tensor rows = logits.reshape({-1, vocab});
    const at::Tensor flat_target = target.reshape({-1});
    SliceLogNormaliser normaliser =
        internal::LogNormaliser(rows, flat_target, SliceOf(group, vocab));
    OverGroup(normaliser, group);
    ctx->save_for_backward({rows, flat_target, normaliser.lse});
    ctx->saved_data["group"] = encoded_group;
    ctx->saved_data["shape"] = logits.sizes().vec();
    return (normaliser.lse - normaliser.target_logit).view(target.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const at::Tensor grad =
        internal::SoftmaxMinusTarget(saved[0], saved[1], SliceOf(group, saved[0].size(1)),
                                     saved[2], grad_output[0].reshape({-1}));
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

// The output layer and the loss over chunks of `chunk_len` positions. Forward keeps each
// position's log-normaliser (logsumexp over the whole vocabulary) and no logits; backward makes
// each chunk's logits again, turns them into softmax - one_hot(target) times the loss's
// gradient, and multiplies that into the chunk's hidden gradient and the weight's (float32)
// gradient before the next chunk.
struct ChunkedLinear : torch::autograd::Function<ChunkedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& target,
                            int64_t encoded_group, int64_t chunk_len,
                            std::optional<int64_t> real_columns) {
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(encoded_group);
    const int64_t vocab = weight.size(0);
    const VocabSlice slice{base::GroupRank(group) * vocab,
                           std::clamp<int64_t>(real_columns.value_or(vocab), 0, vocab)};
    const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor flat_target = target.reshape({-1});
    const int64_t positions = rows.size(0);
    const at::TensorOptions floats = rows.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({positions}, floats);
    at::Tensor target_logit = at::empty({positions}, floats);
    for (int64_t begin = 0; begin < positions; begin += chunk_len) {
      const int64_t end = std::min(positions, begin + chunk_len);
      SliceLogNormaliser chunk = internal::LogNormaliser(
          at::mm(rows.slice(0, begin, end), weight.t()), flat_target.slice(0, begin, end), slice);
      OverGroup(chunk, group);
      lse.slice(0, begin, end).copy_(chunk.lse);
      target_logit.slice(0, begin, end).copy_(chunk.target_logit);
    }
    ctx->save_for_backward({rows, weight, flat_target, lse});
    ctx->saved_data["chunk_len"] = chunk_len;
    ctx->saved_data["begin"] = slice.begin;
    ctx->saved_data["real"] = slice.real;
    ctx->saved_data["hidden_shape"] = hidden.sizes().vec();
    return (lse - target_logit).view(target.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& target = saved[2];
    const at::Tensor& lse = saved[3];
    const int64_t chunk_len = ctx->saved_data["chunk_len"].toInt();
    const VocabSlice slice{ctx->saved_data["begin"].toInt(), ctx->saved_data["real"].toInt()};
    const at::Tensor grad_loss = grad_output[0].reshape({-1});
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    // With a main gradient, each chunk's product is added there; else summed here in float32.
    MainGrad* main = want_weight ? MainGradOf(weight) : nullptr;
    at::Tensor grad_hidden = want_hidden ? at::empty_like(rows) : at::Tensor();
    at::Tensor grad_weight = want_weight && main == nullptr
                                 ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat))
                                 : at::Tensor();
    for (int64_t begin = 0; begin < rows.size(0); begin += chunk_len) {
      const int64_t end = std::min(rows.size(0), begin + chunk_len);
      const at::Tensor chunk = rows.slice(0, begin, end);
      // softmax - one_hot(target), times the loss's gradient, in the weight's dtype.
      const at::Tensor g = internal::SoftmaxMinusTarget(
          at::mm(chunk, weight.t()), target.slice(0, begin, end), slice,
          lse.slice(0, begin, end), grad_loss.slice(0, begin, end));
      if (want_hidden) {
        at::Tensor out = grad_hidden.slice(0, begin, end);
        at::mm_out(out, g, weight);
      }
      if (!want_weight) continue;
      if (main != nullptr) {
        main->AddWeightGradient(g, chunk);
      } else if (g.scalar_type() == at::kFloat) {
        grad_weight.addmm_(g.t(), chunk);
      } else {
        grad_weight.add_(at::mm(g.t(), chunk));
      }
    }
    return {want_hidden ? grad_hidden.view(ctx->saved_data["hidden_shape"].toIntVector())
                        : at::Tensor(),
            grad_weight.defined() ? grad_weight.to(weight.scalar_type()) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor WithoutPadding(const at::Tensor& logits, std::optional<int64_t> real_columns) {
  return real_columns.has_value() ? internal::MaskPadding(logits, *real_columns) : logits;
}

at::Tensor LinearCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& target, c10d::ProcessGroup* group,
                              const LinearCrossEntropyOptions& options) {
  if (options.chunk_len == 0) {
    return VocabParallelCrossEntropy(
        WithoutPadding(LinearWithGradAccumulation(hidden, {weight}, at::Tensor(), nullptr),
                       options.real_columns),
        target, group);
  }
  return ChunkedLinear::apply(hidden, weight, target, reinterpret_cast<intptr_t>(group),
                              options.chunk_len, options.real_columns);
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     c10d::ProcessGroup* group) {
  if (base::GroupSize(group) == 1 && !internal::TakesKernels(logits)) {
    return WholeVocab::apply(logits, target);
  }
  return VocabParallel::apply(logits, target, reinterpret_cast<intptr_t>(group));
}

}  // namespace keel::parallel
