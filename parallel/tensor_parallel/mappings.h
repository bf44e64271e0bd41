// The conjugate collectives of tensor parallelism as autograd functions, after Megatron-Core's
// tensor_parallel/mappings.py, over a tensor-parallel group (nullptr: one rank, where each is
// the identity):
//   CopyToTensorParallelRegion      forward: identity          backward: all-reduce (sum)
//   ReduceFromTensorParallelRegion  forward: all-reduce (sum)  backward: identity
//   ScatterToTensorParallelRegion   forward: this rank's chunk of the last dimension
//                                   backward: all-gather along the last dimension
//   GatherFromTensorParallelRegion  forward: all-gather along the last dimension
//                                   backward: this rank's chunk
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

#include "ATen/core/Tensor.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

at::Tensor CopyToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor ReduceFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor ScatterToTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);
at::Tensor GatherFromTensorParallelRegion(const at::Tensor& input, c10d::ProcessGroup* group);

// Without autograd, for code that computes its own backward (the vocabulary-parallel
// cross-entropy): `tensor` summed (or maximised) over the group in place.
void AllReduceInPlace(at::Tensor& tensor, c10d::ProcessGroup* group, bool max = false);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_MAPPINGS_H_
