// The one place where Keel's code differs between the LibTorch builds it supports (2.6 and
// later, with or without CUDA): c10d process-group construction (a Gloo or NCCL backend that a
// ProcessGroup wraps), settings whose API changed between versions, and what only a CUDA
// LibTorch has (NCCL groups, the current device, events, the caching allocator). The first
// group Keel creates turns c10d's flight recorder off (TORCH_FR_BUFFER_SIZE=0) unless
// TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is set: it crashes when two threads
// start collectives on new groups at once (see torch_compat.cc).
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
//   c10::intrusive_ptr<c10d::ProcessGroup> group =
//       keel::base::CreateGlooProcessGroup(store, rank, world_size, std::chrono::seconds(60));
#ifndef KEEL_BASE_TORCH_COMPAT_H_
#define KEEL_BASE_TORCH_COMPAT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "ATen/core/Tensor.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "torch/optim/optimizer.h"

namespace keel::base {

// A Gloo process group of `size` ranks rendezvousing through `store`, using the network
// interface that `hostname` resolves to. Collective: a rendezvous of all `size` ranks.
// Throws c10::Error when the rendezvous fails (callers convert with CallTorch).
c10::intrusive_ptr<c10d::ProcessGroup> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname = "127.0.0.1");

// Whether CreateNcclProcessGroup can succeed: a CUDA LibTorch with NCCL (KEEL_LIBTORCH) built
// with --config=cuda. Says nothing about GPUs being present (torch::cuda::device_count()).
bool HasNccl();

// An NCCL process group of `size` ranks rendezvousing through `store`, for CUDA tensors on each
// rank's current device (SetCudaDevice first). Collective: a rendezvous of all `size` ranks.
// Throws c10::Error when !HasNccl() or the rendezvous fails (callers convert with CallTorch).
c10::intrusive_ptr<c10d::ProcessGroup> CreateNcclProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// Makes CUDA device `index` this thread's current device. Throws c10::Error without a CUDA
// LibTorch or for a device that does not exist.
void SetCudaDevice(int index);

// The rendezvous store of a torchrun-style launch: rank 0 serves it at host:port, the others
// connect; construction waits up to `timeout` for all `world_size` ranks.
// Throws c10::Error when the store cannot be reached (callers convert with CallTorch).
c10::intrusive_ptr<c10d::Store> CreateTcpStore(const std::string& host, int port, bool is_server,
                                               int world_size, std::chrono::milliseconds timeout);

// The key of a parameter's state in torch::optim::Optimizer::state(): the address of its
// TensorImpl.
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param);

// Lets float32 matrix products on CUDA run on TF32 tensor cores (torch.backends.cuda.matmul's
// fp32_precision = "tf32"; allow_tf32 before 2.11), or back to full float32 ("ieee"): a
// process-wide setting of LibTorch's, read by every later product. bf16 products are not
// affected.
void SetCudaMatmulTf32(bool enabled);

// Marks the work queued so far on the current CUDA stream of `device` (an event recorded on
// it); the returned function blocks the thread that calls it, any thread, until that work has
// run. For non_blocking device-to-host copies that another thread reads afterwards.
// Throws c10::Error without a CUDA LibTorch.
std::function<void()> RecordCudaFence(const at::Device& device);

// Releases the CUDA caching allocator's unused blocks (torch.cuda.empty_cache()); nothing to
// do with a LibTorch built without CUDA.
void ReleaseCachedCudaMemory();

// The CUDA caching allocator's bytes of live tensors on device `index` (-1: the current device)
// (torch.cuda.memory_allocated); 0 with a LibTorch built without CUDA.
int64_t CudaMemoryAllocated(c10::DeviceIndex index);

// The caching allocator's peak of those bytes since its last reset
// (torch.cuda.max_memory_allocated), then resets the peak (reset_peak_memory_stats); 0 with a
// LibTorch built without CUDA.
int64_t TakeCudaPeakMemoryAllocated(c10::DeviceIndex index);

// The memory of CUDA device `index` (-1: the current device) in bytes
// (torch.cuda.get_device_properties().total_memory); 0 with a LibTorch built without CUDA.
int64_t CudaTotalMemory(c10::DeviceIndex index);

}  // namespace keel::base

#endif  // KEEL_BASE_TORCH_COMPAT_H_
