#include "base/torch_compat.h"

#include <stdlib.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>

#include "ATen/ATen.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/version.h"

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 6)
#error "Keel supports LibTorch 2.6 or later (see third_party/libtorch/workspace.bzl)"
#endif

#ifdef KEEL_LIBTORCH_HAS_CUDA
#include "ATen/cuda/CUDAContextLight.h"
#include "ATen/cuda/CUDAEvent.h"
#include "c10/cuda/CUDACachingAllocator.h"
#include "c10/cuda/CUDAFunctions.h"
#include "c10/cuda/CUDAStream.h"
#endif
#if defined(KEEL_LIBTORCH_HAS_CUDA) && defined(USE_C10D_NCCL)
#include "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
#define KEEL_HAS_NCCL 1
#endif

namespace keel::base {
namespace {

// LibTorch records collectives in a process-wide flight recorder whose first record of a
// group inserts it into a map before taking the recorder's lock
// (FlightRecorder::recordWithResetEnabled, c10d/FlightRecorderDetail.hpp, as of 2.11): two
// threads starting collectives on new groups at once corrupt the map (a segfault seen in Keel's
// tests, ranks on threads; a trainer's checkpoint thread and main thread can do the same).
// Keel turns the recorder off before its first group, unless its size is set.
void TurnOffFlightRecorderUnlessSet() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("TORCH_FR_BUFFER_SIZE") == nullptr &&
        std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") == nullptr) {
      ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
    }
  });
}

// A backend serves a ProcessGroup, here one whose only backend is `backend`, for tensors of
// `device`.
c10::intrusive_ptr<c10d::ProcessGroup> AsProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      c10d::ProcessGroup::BackendType type,
                                                      c10::DeviceType device,
                                                      c10::intrusive_ptr<c10d::Backend> backend) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(type);
  group->setBackend(device, type, std::move(backend));
  return group;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname) {
  TurnOffFlightRecorderUnlessSet();
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return AsProcessGroup(store, rank, size, c10d::ProcessGroup::BackendType::GLOO,
                        c10::DeviceType::CPU, gloo);
}

bool HasNccl() {
#ifdef KEEL_HAS_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> CreateNcclProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
#ifdef KEEL_HAS_NCCL
  TurnOffFlightRecorderUnlessSet();
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  return AsProcessGroup(store, rank, size, c10d::ProcessGroup::BackendType::NCCL,
                        c10::DeviceType::CUDA, nccl);
#else
  TORCH_CHECK(false,
              "NCCL is not available: build with --config=cuda against a CUDA LibTorch "
              "(KEEL_LIBTORCH)");
#endif
}

void SetCudaDevice(int index) {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  TORCH_CHECK(false, "CUDA device ", index, " requested from a LibTorch built without CUDA");
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

OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param) {
  return param.unsafeGetTensorImpl();
}

void SetCudaMatmulTf32(bool enabled) {
#if (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11) || TORCH_VERSION_MAJOR > 2
  at::globalContext().setFloat32Precision(
      at::Float32Backend::CUDA, at::Float32Op::MATMUL,
      enabled ? at::Float32Precision::TF32 : at::Float32Precision::IEEE);
#else
  at::globalContext().setAllowTF32CuBLAS(enabled);
#endif
}

void ReleaseCachedCudaMemory() {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

#ifdef KEEL_LIBTORCH_HAS_CUDA
namespace {
// `index`, or the current device for -1 (a device given as "cuda").
c10::DeviceIndex Concrete(c10::DeviceIndex index) {
  return index >= 0 ? index : c10::cuda::current_device();
}

c10::CachingAllocator::Stat AllocatedBytes(c10::DeviceIndex index) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(Concrete(index))
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace
#endif

int64_t CudaMemoryAllocated(c10::DeviceIndex index) {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  return AllocatedBytes(index).current;
#else
  return 0;
#endif
}

int64_t CudaTotalMemory(c10::DeviceIndex index) {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  return static_cast<int64_t>(at::cuda::getDeviceProperties(Concrete(index))->totalGlobalMem);
#else
  return 0;
#endif
}

int64_t TakeCudaPeakMemoryAllocated(c10::DeviceIndex index) {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  const int64_t peak = AllocatedBytes(index).peak;
  c10::cuda::CUDACachingAllocator::resetPeakStats(Concrete(index));
  return peak;
#else
  return 0;
#endif
}

std::function<void()> RecordCudaFence(const at::Device& device) {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(c10::cuda::getCurrentCUDAStream(device.index()));
  return [event] { event->synchronize(); };
#else
  TORCH_CHECK(false, "a CUDA fence on ", device.str(),
              " requested from a LibTorch built without CUDA");
#endif
}

}  // namespace keel::base
