#include "parallel/tensor_parallel/mappings.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "parallel/comm_timers.h"
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

// Saves the input as given (this rank's share of the sequence) and gathers it again in the
// backward pass for the weight's gradient, rather than keeping the whole sequence.
struct SequenceGathered : torch::autograd::Function<SequenceGathered> {
  // The bias is optional: autograd takes no undefined tensor as an input.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, int64_t group) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["bias"] = bias.has_value();
    ctx->save_for_backward({input, weight});
    auto* tp = reinterpret_cast<c10d::ProcessGroup*>(group);
    return at::linear(Gathered(input, tp, kSequenceDim), weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    c10d::ProcessGroup* group = Decode(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor rows = grad[0].reshape({-1, grad[0].size(-1)});
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      grad_input = ReduceScattered(grad[0].matmul(weight), group, kSequenceDim);
    }
    if (ctx->needs_input_grad(1)) {
      const at::Tensor whole = Gathered(input, group, kSequenceDim);
      grad_weight = rows.t().mm(whole.reshape({-1, whole.size(-1)}));
    }
    // needs_input_grad counts the tensors given: the bias is the third when there is one.
    if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = rows.sum(0);
    return {grad_input, grad_weight, grad_bias, at::Tensor()};
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

at::Tensor SequenceGatheredLinear(const at::Tensor& input, const at::Tensor& weight,
                                  const at::Tensor& bias, c10d::ProcessGroup* group) {
  if (group == nullptr || group->getSize() == 1) return at::linear(input, weight, bias);
  const std::optional<at::Tensor> optional_bias =
      bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt;
  return SequenceGathered::apply(input, weight, optional_bias, Encode(group));
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
