#include "base/torch_compat.h"

#include "ATen/ATen.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/version.h"

#ifdef KEEL_LIBTORCH_HAS_CUDA
#include "c10/cuda/CUDACachingAllocator.h"
#endif

namespace keel::base {

c10::intrusive_ptr<c10d::ProcessGroup> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return group;
#else
  return gloo;
#endif
}

c10::intrusive_ptr<c10d::Store> CreateTcpStore(const std::string& host, int port, bool is_server,
                                               int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = static_cast<size_t>(world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

void ForeachMulInPlace(at::TensorList tensors, const at::Tensor& scalar) {
#if (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1) || TORCH_VERSION_MAJOR > 2
  at::_foreach_mul_(tensors, scalar);
#else
  for (const at::Tensor& tensor : tensors) tensor.mul_(scalar);
#endif
}

void ReleaseCachedCudaMemory() {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

}  // namespace keel::base
