// A stand-in for an NCCL process group on a machine without GPUs, so that CPU-only tests prove
// that no host tensor reaches a device group. Its "device" tensors are on testing::FakeGpu();
// the group refuses host (CPU) tensors as NCCL does, with the message of LibTorch 2.x's
// dispatcher, and carries the fake GPU's by staging them through a Gloo group of the same ranks.
//
//   at::Tensor ones = at::ones({3}).to(keel::testing::FakeGpu());
//   std::vector<at::Tensor> tensors = {ones};
//   group->allreduce(tensors)->wait();            // fine: a device tensor
//   group->allreduce(host_tensors);               // throws: "No backend type associated ..."
#ifndef KEEL_TESTING_NCCL_LIKE_GROUP_H_
#define KEEL_TESTING_NCCL_LIKE_GROUP_H_

#include <string>
#include <vector>

#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::testing {

// A process group of backend "nccl" over the ranks of `gloo`, for FakeGpu() tensors only. Every
// collective runs synchronously (the returned work is complete); Keel's exchanges are the only
// ones implemented: broadcast, allreduce, allgather, _allgather_base, _reduce_scatter_base,
// alltoall_base, send, recv and barrier. Others throw, as does any tensor not on the fake GPU.
class NcclLikeGroup final : public c10d::ProcessGroup {
 public:
  explicit NcclLikeGroup(c10::intrusive_ptr<c10d::ProcessGroup> gloo);

  const std::string getBackendName() const override { return "nccl"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& options) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& options) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& options) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& options) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& options) override;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> gloo_;
};

}  // namespace keel::testing

#endif  // KEEL_TESTING_NCCL_LIKE_GROUP_H_
