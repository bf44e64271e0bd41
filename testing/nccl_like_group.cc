#include "testing/nccl_like_group.h"

#include <utility>

#include "ATen/ATen.h"
#include "testing/fake_gpu.h"

namespace keel::testing {
namespace {

// Work that is done when it is returned.
class DoneWork final : public c10d::Work {
 public:
  DoneWork() { finish(); }
};

c10::intrusive_ptr<c10d::Work> Done() { return c10::make_intrusive<DoneWork>(); }

// Refuses what NCCL refuses, in the words of LibTorch 2.x's dispatcher for a device type the
// group has no backend for.
void CheckOnDevice(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().type() == FakeGpu().type(),
              "No backend type associated with device type ", tensor.device().type());
}

// A copy on the host of a tensor bound for the group.
at::Tensor ToHost(const at::Tensor& tensor) {
  CheckOnDevice(tensor);
  return tensor.to(at::kCPU).contiguous();
}

// A host buffer for what the group writes into `tensor`.
at::Tensor HostBuffer(const at::Tensor& tensor) {
  CheckOnDevice(tensor);
  return at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
}

std::vector<at::Tensor> ToHost(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> host;
  for (const at::Tensor& tensor : tensors) host.push_back(ToHost(tensor));
  return host;
}

void CopyBack(std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& host) {
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(host[i]);
}

}  // namespace

NcclLikeGroup::NcclLikeGroup(c10::intrusive_ptr<c10d::ProcessGroup> gloo)
    : c10d::ProcessGroup(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)) {}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& options) {
  std::vector<at::Tensor> host = ToHost(tensors);
  gloo_->broadcast(host, options)->wait();
  CopyBack(tensors, host);
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& options) {
  std::vector<at::Tensor> host = ToHost(tensors);
  gloo_->allreduce(host, options)->wait();
  CopyBack(tensors, host);
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& options) {
  std::vector<at::Tensor> host_inputs = ToHost(inputs);
  std::vector<std::vector<at::Tensor>> host_outputs;
  for (const std::vector<at::Tensor>& output : outputs) {
    host_outputs.emplace_back();
    for (const at::Tensor& tensor : output) host_outputs.back().push_back(HostBuffer(tensor));
  }
  gloo_->allgather(host_outputs, host_inputs, options)->wait();
  for (size_t i = 0; i < outputs.size(); ++i) CopyBack(outputs[i], host_outputs[i]);
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& options) {
  CheckOnDevice(output);
  std::vector<at::Tensor> host_input = {ToHost(input)};
  std::vector<std::vector<at::Tensor>> host_outputs(1);
  for (int r = 0; r < getSize(); ++r) host_outputs[0].push_back(at::empty_like(host_input[0]));
  gloo_->allgather(host_outputs, host_input, options)->wait();
  output.copy_(at::cat(host_outputs[0]).view_as(output));
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& options) {
  CheckOnDevice(output);
  std::vector<at::Tensor> host = {ToHost(input)};
  c10d::AllreduceOptions sum;
  sum.reduceOp = options.reduceOp;
  gloo_->allreduce(host, sum)->wait();
  output.copy_(
      host[0].view(-1).narrow(0, getRank() * output.numel(), output.numel()).view_as(output));
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& options) {
  at::Tensor host_output = HostBuffer(output);
  at::Tensor host_input = ToHost(input);
  gloo_->alltoall_base(host_output, host_input, output_split_sizes, input_split_sizes, options)
      ->wait();
  output.copy_(host_output);
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
  std::vector<at::Tensor> host = ToHost(tensors);
  gloo_->send(host, dst_rank, tag)->wait();
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
  std::vector<at::Tensor> host;
  for (const at::Tensor& tensor : tensors) host.push_back(HostBuffer(tensor));
  gloo_->recv(host, src_rank, tag)->wait();
  CopyBack(tensors, host);
  return Done();
}

c10::intrusive_ptr<c10d::Work> NcclLikeGroup::barrier(const c10d::BarrierOptions& options) {
  gloo_->barrier(options)->wait();
  return Done();
}

}  // namespace keel::testing
