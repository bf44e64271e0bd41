#include "parallel/tensor_parallel/cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

#ifdef KEEL_CUDA_KERNELS
#include "ATen/cuda/CUDAContext.h"
#include "c10/cuda/CUDAGuard.h"
#include "parallel/tensor_parallel/internal/cross_entropy_cuda.h"
#endif

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

#ifdef KEEL_CUDA_KERNELS
// WholeVocab's loss and gradient for bf16 logits on a GPU, in Keel's kernels
// (internal/cross_entropy_cuda.cu): forward reads the logits once and keeps them (bf16) and each
// row's float32 log-normaliser, not float32 log-probabilities; backward reads them once more and
// writes the gradient. About 6 bytes of memory traffic per logit, where WholeVocab's ATen
// passes take about 28.
struct WholeVocabKernel : torch::autograd::Function<WholeVocabKernel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target) {
    const int64_t vocab = logits.size(-1);
    const at::Tensor rows = logits.reshape({-1, vocab}).contiguous();
    const at::Tensor flat_target = target.reshape({-1}).contiguous();
    const c10::cuda::CUDAGuard on_its_device(rows.device());
    const at::TensorOptions floats = rows.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({rows.size(0)}, floats);
    at::Tensor loss = at::empty({rows.size(0)}, floats);
    if (rows.size(0) > 0) {
      const char* error = internal::LaunchCrossEntropyForward(
          rows.data_ptr(), flat_target.data_ptr<int64_t>(), rows.size(0), vocab,
          lse.data_ptr<float>(), loss.data_ptr<float>(),
          at::cuda::getCurrentCUDAStream(rows.device().index()).stream());
      TORCH_CHECK(error == nullptr, "Keel's cross-entropy kernel (forward): ", error);
    }
    ctx->save_for_backward({rows, flat_target, lse});
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.view(target.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const c10::cuda::CUDAGuard on_its_device(rows.device());
    const at::Tensor grad_loss = grad_output[0].reshape({-1}).to(at::kFloat).contiguous();
    at::Tensor grad = at::empty(rows.sizes(), rows.options());
    if (rows.size(0) > 0) {
      const char* error = internal::LaunchCrossEntropyBackward(
          rows.data_ptr(), saved[1].data_ptr<int64_t>(), saved[2].data_ptr<float>(),
          grad_loss.data_ptr<float>(), rows.size(0), rows.size(1), grad.data_ptr(),
          at::cuda::getCurrentCUDAStream(rows.device().index()).stream());
      TORCH_CHECK(error == nullptr, "Keel's cross-entropy kernel (backward): ", error);
    }
    return {grad.view(ctx->saved_data["shape"].toIntVector()), at::Tensor()};
  }
};
#endif

// The output layer and the loss over chunks of `chunk_len` positions. Forward keeps each
// position's log-normaliser (logsumexp over the whole vocabulary) and no logits; backward makes
// each chunk's logits again, turns them into softmax - one_hot(target) times the loss's
// gradient, and multiplies that into the chunk's hidden gradient and the weight's (float32)
// gradient before the next chunk.
struct ChunkedLinear : torch::autograd::Function<ChunkedLinear> {
  // Rows [begin, end) of the logits slice, float32, padding columns at -inf.
  static at::Tensor ChunkLogits(const at::Tensor& hidden, const at::Tensor& weight, int64_t begin,
                                int64_t end, std::optional<int64_t> real_columns) {
    return WithoutPadding(at::mm(hidden.slice(0, begin, end), weight.t()).to(at::kFloat),
                          real_columns);
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& target,
                            int64_t encoded_group, int64_t chunk_len,
                            std::optional<int64_t> real_columns) {
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(encoded_group);
    const int64_t vocab = weight.size(0);
    const int64_t begin_column = base::GroupRank(group) * vocab;
    const at::Tensor rows = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor flat_target = target.reshape({-1});
    const at::Tensor outside =
        flat_target.lt(begin_column).logical_or(flat_target.ge(begin_column + vocab));
    const at::Tensor local_target = (flat_target - begin_column).masked_fill(outside, 0);
    const int64_t positions = rows.size(0);
    at::Tensor log_normaliser = at::empty({positions}, rows.options().dtype(at::kFloat));
    at::Tensor predicted = at::empty({positions}, rows.options().dtype(at::kFloat));
    for (int64_t begin = 0; begin < positions; begin += chunk_len) {
      const int64_t end = std::min(positions, begin + chunk_len);
      const at::Tensor logits = ChunkLogits(rows, weight, begin, end, real_columns);
      at::Tensor max = std::get<0>(logits.max(-1)).contiguous();
      AllReduceInPlace(max, group, /*max=*/true);
      at::Tensor sum_exp = (logits - max.unsqueeze(-1)).exp().sum(-1).contiguous();
      AllReduceInPlace(sum_exp, group);
      log_normaliser.slice(0, begin, end).copy_(sum_exp.log().add_(max));
      predicted.slice(0, begin, end)
          .copy_(logits.gather(-1, local_target.slice(0, begin, end).unsqueeze(-1))
                     .squeeze(-1)
                     .masked_fill(outside.slice(0, begin, end), 0));
    }
    AllReduceInPlace(predicted, group);
    ctx->save_for_backward({rows, weight, local_target, outside, log_normaliser});
    ctx->saved_data["chunk_len"] = chunk_len;
    ctx->saved_data["real_columns"] = real_columns.value_or(vocab);
    ctx->saved_data["hidden_shape"] = hidden.sizes().vec();
    return (log_normaliser - predicted).view(target.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& local_target = saved[2];
    const at::Tensor& outside = saved[3];
    const at::Tensor& log_normaliser = saved[4];
    const int64_t chunk_len = ctx->saved_data["chunk_len"].toInt();
    const int64_t real_columns = ctx->saved_data["real_columns"].toInt();
    const at::Tensor grad_loss = grad_output[0].reshape({-1}).to(at::kFloat);
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    at::Tensor grad_hidden = want_hidden ? at::empty_like(rows) : at::Tensor();
    at::Tensor grad_weight =
        want_weight ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t begin = 0; begin < rows.size(0); begin += chunk_len) {
      const int64_t end = std::min(rows.size(0), begin + chunk_len);
      // softmax - one_hot(target), times the loss's gradient, in the weight's dtype.
      at::Tensor grad_logits = ChunkLogits(rows, weight, begin, end, real_columns);
      grad_logits.sub_(log_normaliser.slice(0, begin, end).unsqueeze(-1)).exp_();
      grad_logits.scatter_add_(
          -1, local_target.slice(0, begin, end).unsqueeze(-1),
          outside.slice(0, begin, end).logical_not().to(at::kFloat).neg().unsqueeze(-1));
      grad_logits.mul_(grad_loss.slice(0, begin, end).unsqueeze(-1));
      const at::Tensor g = grad_logits.to(weight.scalar_type());
      if (want_hidden) {
        at::Tensor out = grad_hidden.slice(0, begin, end);
        at::mm_out(out, g, weight);
      }
      if (!want_weight) continue;
      const at::Tensor chunk = rows.slice(0, begin, end);
      if (g.scalar_type() == at::kFloat) {
        grad_weight.addmm_(g.t(), chunk);
      } else {
        grad_weight.add_(at::mm(g.t(), chunk));
      }
    }
    return {want_hidden ? grad_hidden.view(ctx->saved_data["hidden_shape"].toIntVector())
                        : at::Tensor(),
            want_weight ? grad_weight.to(weight.scalar_type()) : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor WithoutPadding(const at::Tensor& logits, std::optional<int64_t> real_columns) {
  const int64_t columns = logits.size(-1);
  if (!real_columns.has_value() || *real_columns >= columns) return logits;
  const at::Tensor padding = at::arange(columns, logits.options().dtype(at::kLong))
                                 .ge(std::max<int64_t>(0, *real_columns));
  return logits.masked_fill(padding, -std::numeric_limits<float>::infinity());
}

at::Tensor LinearCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& target, c10d::ProcessGroup* group,
                              const LinearCrossEntropyOptions& options) {
  if (options.chunk_len == 0) {
    return VocabParallelCrossEntropy(
        WithoutPadding(at::linear(hidden, weight), options.real_columns), target, group);
  }
  return ChunkedLinear::apply(hidden, weight, target, reinterpret_cast<intptr_t>(group),
                              options.chunk_len, options.real_columns);
}

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& target,
                                     c10d::ProcessGroup* group) {
  if (base::GroupSize(group) == 1) {
#ifdef KEEL_CUDA_KERNELS
    if (logits.is_cuda() && logits.scalar_type() == at::kBFloat16) {
      return WholeVocabKernel::apply(logits, target);
    }
#endif
    return WholeVocab::apply(logits, target);
  }
  return VocabParallel::apply(logits.to(at::kFloat), target, reinterpret_cast<intptr_t>(group));
}

}  // namespace keel::parallel
