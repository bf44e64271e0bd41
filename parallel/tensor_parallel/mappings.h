// The conjugate collectives of tensor parallelism as autograd functions, after Megatron-Core's
// tensor_parallel/mappings.py, over a tensor-parallel group (nullptr: one rank, where each is
// the identity):
//   CopyToTensorParallelRegion      forward: identity          backward: all-reduce (sum)
//   ReduceFromTensorParallelRegion  forward: all-reduce (sum)  backward: identity
//   ScatterToTensorParallelRegion   forward: this rank's chunk of the last dimension
//                                   backward: all-gather along the last dimension
//   GatherFromTensorParallelRegion  forward: all-gather along the last dimension
//                                   backward: this rank's chunk
// and those of sequence parallelism, along the sequence (dimension 1 of Keel's [batch, seq,
// hidden] activations, where Megatron's [seq, batch, hidden] has it first):
//   ScatterToSequenceParallelRegion       forward: this rank's chunk of the sequence
//                                         backward: all-gather along the sequence
//   GatherFromSequenceParallelRegion      forward: all-gather along the sequence
//                                         backward: reduce-scatter (each rank's gradient a
//                                         partial sum), or this rank's chunk (a whole one)
//   ReduceScatterToSequenceParallelRegion forward: reduce-scatter along the sequence
//                                         backward: all-gather along the sequence
//
//   at::Tensor x = CopyToTensorParallelRegion(input, tp);  // before a column-parallel matmul
//   at::Tensor y = ReduceFromTensorParallelRegion(at::matmul(x_parallel, w.t()), tp);
//
// Their time, from the call until the result is in place, counts as CommKind::kTensorParallel
// (comm_timers.h). Collective: every rank of the group runs them in the same order, in forward
// and in backward.
// Errors: they run inside autograd, where nothing returns a status: a failed collective throws
// c10::Error (Keel's callers turn it into a status with base::CallTorch around forward and
// backward). Requires: the group outlives the graph; split dimensions divide by its size.
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_MAPPINGS_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_MAPPINGS_H_

#include <vector>

#include "ATen/core/Tensor.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

at::Tensor CopyToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor ReduceFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor ScatterToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor GatherFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor ScatterToSequenceParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
// `tensor_parallel_output_grad` (Megatron's): the gradient of the gathered tensor on each rank
// is a partial sum over the group (true: the backward reduce-scatters it), or whole and equal
// on every rank (false: the backward keeps this rank's chunk).
at::Tensor GatherFromSequenceParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group,
                                            bool tensor_parallel_output_grad = true);
at::Tensor ReduceScatterToSequenceParallelRegion(const at::Tensor& input,
                                                 c10d::ProcessGroup* group);

// at::linear(x, at::cat(weights), bias) (bias undefined: none), x the input, or with a
// sequence group of more than one rank the input gathered along the sequence (Megatron's
// linear_with_grad_accumulation_and_async_allreduce): then only `input`, this rank's share, is
// kept for the backward pass, which gathers it again for the weights' gradients. Each weight's
// gradient goes into its main gradient where a sync offers one (parallel/main_grad.h:
// Megatron's gradient_accumulation_fusion), else to autograd. Backward uses the weights
// themselves, stacked again, not a stacked copy kept from forward. One weight with neither a
// gather nor a main gradient: at::linear itself. Requires: at least one weight; all of one
// width.
at::Tensor LinearWithGradAccumulation(const at::Tensor& input,
                                      const std::vector<at::Tensor>& weights,
                                      const at::Tensor& bias, c10d::ProcessGroup* sequence_group);

// Without autograd, for code that computes its own backward (the vocabulary-parallel
// cross-entropy): `tensor` summed (or maximised) over the group in place.
void AllReduceInPlace(at::Tensor& tensor, c10d::ProcessGroup* group, bool max = false);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_MAPPINGS_H_
