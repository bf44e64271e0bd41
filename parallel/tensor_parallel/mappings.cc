#include "parallel/tensor_parallel/mappings.h"

#include <atomic>
#include <chrono>
#include <cstdint>
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

// This rank's chunk of the last dimension.
at::Tensor Split(const at::Tensor& input, c10d::ProcessGroup* group) {
  return input.chunk(group->getSize(), -1)[group->getRank()].contiguous();
}

// Every rank's `input`, concatenated along the last dimension in rank order.
at::Tensor Gathered(const at::Tensor& input, c10d::ProcessGroup* group) {
  base::CheckGroupCarriesOrThrow(group, input.device(), "the tensor-parallel all-gather");
  const at::Tensor mine = input.contiguous();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group->getSize(); ++r) outputs[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> inputs = {mine};
  CommTimers::Time(CommKind::kTensorParallel, [&] { group->allgather(outputs, inputs)->wait(); });
  return at::cat(outputs[0], -1);
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
    return Split(input, reinterpret_cast<c10d::ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Gathered(grad[0], Decode(ctx)), at::Tensor()};
  }
};

struct GatherFrom : torch::autograd::Function<GatherFrom> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t group) {
    ctx->saved_data["group"] = group;
    return Gathered(input, reinterpret_cast<c10d::ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {Split(grad[0], Decode(ctx)), at::Tensor()};
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

void AllReduceInPlace(at::Tensor& tensor, c10d::ProcessGroup* group, bool max) {
  if (group == nullptr || group->getSize() == 1) return;
  base::CheckGroupCarriesOrThrow(group, tensor.device(), "the tensor-parallel all-reduce");
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  CommTimers::Time(CommKind::kTensorParallel, [&] { group->allreduce(tensors, options)->wait(); });
}

}  // namespace keel::parallel
