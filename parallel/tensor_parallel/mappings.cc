#include "parallel/tensor_parallel/mappings.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/comm_timers.h"
#include "parallel/main_grad.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through autograd as an integer (a ProcessGroup is not an IValue type in
// every LibTorch).
int64_t Encode(c10d::ProcessGroup* group) { return reinterpret_cast<intptr_t>(group); }
c10d::ProcessGroup* Decode(AutogradContext* ctx) {
  return reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
}

at::Tensor AllReduced(const at::Tensor& input, c10d::ProcessGroup* group) {
  base::CheckGroupCarriesOrThrow(group, input.device(), "the tensor-parallel all-reduce");
  std::vector<at::Tensor> tensors = {input.contiguous().clone()};
  CommTimers::Time(CommKind::kTensorParallel, [&] { group->allreduce(tensors)->wait(); });
  return tensors[0];
}

// The dimension sequence parallelism splits: Keel's activations are [batch, seq, hidden].
constexpr int64_t kSequenceDim = 1;

// This rank's chunk of dimension `dim`.
at::Tensor Split(const at::Tensor& input, c10d::ProcessGroup* group, int64_t dim) {
  return input.chunk(group->getSize(), dim)[group->getRank()].contiguous();
}

// Every rank's `input`, concatenated along `dim` in rank order.
at::Tensor Gathered(const at::Tensor& input, c10d::ProcessGroup* group, int64_t dim) {
  base::CheckGroupCarriesOrThrow(group, input.device(), "the tensor-parallel all-gather");
  const at::Tensor mine = input.contiguous();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group->getSize(); ++r) outputs[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> inputs = {mine};
  CommTimers::Time(CommKind::kTensorParallel, [&] { group->allgather(outputs, inputs)->wait(); });
  return at::cat(outputs[0], dim);
}

// Rank r's chunk of dimension `dim` of the sum of every rank's `input`.
at::Tensor ReduceScattered(const at::Tensor& input, c10d::ProcessGroup* group, int64_t dim) {
  base::CheckGroupCarriesOrThrow(group, input.device(), "the tensor-parallel reduce-scatter");
  const std::vector<at::Tensor> chunks = input.chunk(group->getSize(), dim);
  // The chunks one after another, each contiguous: rank r's block of the flat input.
  at::Tensor flat = at::cat(chunks, 0);
  at::Tensor output = at::empty(chunks[0].sizes(), input.options());
  CommTimers::Time(CommKind::kTensorParallel,
                   [&] { group->_reduce_scatter_base(output, flat)->wait(); });
  return output;
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return input.view_as(input);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {AllReduced(grad[0], Decode(ctx)), at::Tensor()};
  }
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& input, int64_t group) {
    return AllReduced(input, reinterpret_cast<c10d::ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

struct ScatterTo : torch::autograd::Function<ScatterTo> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return Split(input, reinterpret_cast<c10d::ProcessGroup*>(group), -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Gathered(grad[0], Decode(ctx), -1), at::Tensor()};
  }
};

struct GatherFrom : torch::autograd::Function<GatherFrom> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return Gathered(input, reinterpret_cast<c10d::ProcessGroup*>(group), -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Split(grad[0], Decode(ctx), -1), at::Tensor()};
  }
};

struct ScatterToSequence : torch::autograd::Function<ScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return Split(input, reinterpret_cast<c10d::ProcessGroup*>(group), kSequenceDim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Gathered(grad[0], Decode(ctx), kSequenceDim), at::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group,
                            bool tensor_parallel_output_grad) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["reduce"] = tensor_parallel_output_grad;
    return Gathered(input, reinterpret_cast<c10d::ProcessGroup*>(group), kSequenceDim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    c10d::ProcessGroup* group = Decode(ctx);
    return {ctx->saved_data["reduce"].toBool() ? ReduceScattered(grad[0], group, kSequenceDim)
                                               : Split(grad[0], group, kSequenceDim),
            at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return ReduceScattered(input, reinterpret_cast<c10d::ProcessGroup*>(group), kSequenceDim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Gathered(grad[0], Decode(ctx), kSequenceDim), at::Tensor()};
  }
};

// The weights side by side by rows, as one weight.
at::Tensor Stacked(at::TensorList weights) {
  return weights.size() == 1 ? weights[0] : at::cat(weights);
}

// at::linear(x, Stacked(weights), bias), x the input or, with a group, the input gathered along
// the sequence. Saves the input as given (under sequence parallelism this rank's share, gathered
// again in the backward pass for the weights' gradients) and the weights themselves (stacked
// again in the backward pass, not kept stacked). Each weight's gradient goes into its main
// gradient where it has one.
struct LinearOverWeights : torch::autograd::Function<LinearOverWeights> {
  // The bias is optional: autograd takes no undefined tensor as an input.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, at::TensorList weights,
                            const std::optional<at::Tensor>& bias, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["bias"] = bias.has_value();
    variable_list saved = {input};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    auto* sequence_group = reinterpret_cast<c10d::ProcessGroup*>(group);
    const at::Tensor whole =
        sequence_group != nullptr ? Gathered(input, sequence_group, kSequenceDim) : input;
    return at::linear(whole, Stacked(weights), bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    c10d::ProcessGroup* group = Decode(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::TensorList weights = at::TensorList(saved).slice(1);
    const size_t count = weights.size();
    const at::Tensor rows = grad[0].reshape({-1, grad[0].size(-1)});
    // The gradients of the input, each weight, the bias and the group.
    variable_list grads(count + 3);
    if (ctx->needs_input_grad(0)) {
      const at::Tensor grad_input = grad[0].matmul(Stacked(weights));
      grads[0] = group != nullptr ? ReduceScattered(grad_input, group, kSequenceDim) : grad_input;
    }
    at::Tensor whole, product;
    int64_t begin = 0;
    for (size_t i = 0; i < count; ++i) {
      const int64_t height = weights[i].size(0);
      if (ctx->needs_input_grad(1 + i)) {
        if (!whole.defined()) {
          const at::Tensor gathered =
              group != nullptr ? Gathered(input, group, kSequenceDim) : input;
          whole = gathered.reshape({-1, gathered.size(-1)});
        }
        if (MainGrad* main = MainGradOf(weights[i])) {
          main->AddWeightGradient(count == 1 ? rows : rows.narrow(1, begin, height), whole);
        } else {
          // Weights without a main gradient share one product, as autograd's of the stacked
          // weight.
          if (!product.defined()) product = rows.t().mm(whole);
          grads[1 + i] = count == 1 ? product : product.narrow(0, begin, height);
        }
      }
      begin += height;
    }
    // needs_input_grad counts the tensors given: the bias follows the weights when there is one.
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(1 + count)) {
      grads[1 + count] = rows.sum(0);
    }
    return grads;
  }
};

}  // namespace

at::Tensor CopyToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return CopyTo::apply(input, Encode(group));
}

at::Tensor ReduceFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return ReduceFrom::apply(input, Encode(group));
}

at::Tensor ScatterToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return ScatterTo::apply(input, Encode(group));
}

at::Tensor GatherFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return GatherFrom::apply(input, Encode(group));
}

at::Tensor ScatterToSequenceParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return ScatterToSequence::apply(input, Encode(group));
}

at::Tensor GatherFromSequenceParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group,
                                            bool tensor_parallel_output_grad) {
  if (group == nullptr || group->getSize() == 1) return input;
  return GatherFromSequence::apply(input, Encode(group), tensor_parallel_output_grad);
}

at::Tensor ReduceScatterToSequenceParallelRegion(const at::Tensor& input,
                                                 c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return input;
  return ReduceScatterToSequence::apply(input, Encode(group));
}

at::Tensor LinearWithGradAccumulation(const at::Tensor& input,
                                      const std::vector<at::Tensor>& weights,
                                      const at::Tensor& bias, c10d::ProcessGroup* sequence_group) {
  TORCH_CHECK(!weights.empty(), "LinearWithGradAccumulation needs at least one weight");
  const bool gather = sequence_group != nullptr && sequence_group->getSize() > 1;
  const bool fuse = at::GradMode::is_enabled() &&
                    std::any_of(weights.begin(), weights.end(),
                                [](const at::Tensor& w) { return MainGradOf(w) != nullptr; });
  // One weight without either: ATen's own linear. Stacked weights always take the function,
  // which keeps the weights for backward, not a stacked copy of them.
  if (!gather && !fuse && weights.size() == 1) return at::linear(input, weights[0], bias);
  const std::optional<at::Tensor> optional_bias =
      bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return LinearOverWeights::apply(input, at::TensorList(weights), optional_bias,
                                  gather ? Encode(sequence_group) : 0);
}

void AllReduceInPlace(at::Tensor& tensor, c10d::ProcessGroup* group, bool max) {
  if (group == nullptr || group->getSize() == 1) return;
  base::CheckGroupCarriesOrThrow(group, tensor.device(), "the tensor-parallel all-reduce");
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  CommTimers::Time(CommKind::kTensorParallel, [&] { group->allreduce(tensors, options)->wait(); });
}

}  // namespace keel::parallel
