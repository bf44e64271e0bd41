#include "base/torch_compat.h"

#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "ATen/ATen.h"
#include "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp"
#include "torch/csrc/distributed/c10d/TCPStore.hpp"
#include "torch/version.h"

#if TORCH_VERSION_MAJOR >= 2
#include "torch/csrc/autograd/profiler_kineto.h"
#endif

#if !(TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13) && \
    !(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6) && TORCH_VERSION_MAJOR < 3
#error "Keel supports LibTorch 1.13 and 2.6 or later (see third_party/libtorch/workspace.bzl)"
#endif

#ifdef KEEL_LIBTORCH_HAS_CUDA
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

#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x records collectives in a process-wide flight recorder whose first record of a
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

// In 2.x a backend serves a ProcessGroup, here one whose only backend is `backend`, for
// tensors of `device`. (In 1.13 the backend is the group.)
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
#endif

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname) {
#if TORCH_VERSION_MAJOR >= 2
  TurnOffFlightRecorderUnlessSet();
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  return AsProcessGroup(store, rank, size, c10d::ProcessGroup::BackendType::GLOO,
                        c10::DeviceType::CPU, gloo);
#else
  return gloo;
#endif
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
#if TORCH_VERSION_MAJOR >= 2
  TurnOffFlightRecorderUnlessSet();
#endif
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#if TORCH_VERSION_MAJOR >= 2
  return AsProcessGroup(store, rank, size, c10d::ProcessGroup::BackendType::NCCL,
                        c10::DeviceType::CUDA, nccl);
#else
  return nccl;
#endif
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
#if TORCH_VERSION_MAJOR >= 2
  return param.unsafeGetTensorImpl();
#else
  std::ostringstream key;  // what 1.13's c10::guts::to_string does with the pointer
  key << param.unsafeGetTensorImpl();
  return key.str();
#endif
}

void ForeachMulInPlace(at::TensorList tensors, const at::Tensor& scalar) {
#if (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1) || TORCH_VERSION_MAJOR > 2
  at::_foreach_mul_(tensors, scalar);
#else
  for (const at::Tensor& tensor : tensors) tensor.mul_(scalar);
#endif
}

bool HasFusedAdamW() { return TORCH_VERSION_MAJOR >= 2; }

bool GlooCarriesBFloat16() { return TORCH_VERSION_MAJOR >= 2; }

void FusedAdamWStep(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList steps, double lr, double beta1, double beta2,
                    double weight_decay, double eps, bool amsgrad) {
#if TORCH_VERSION_MAJOR >= 2
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
                    weight_decay, eps, amsgrad, /*maximize=*/false);
#else
  TORCH_CHECK(false, "the fused AdamW step needs LibTorch 2.x (ATen's _fused_adamw_); this is ",
              TORCH_VERSION);
#endif
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

bool HasProfiler() { return TORCH_VERSION_MAJOR >= 2; }

void StartProfiler(bool cuda) {
#if TORCH_VERSION_MAJOR >= 2
  using torch::profiler::impl::ActivityType;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
#else
  TORCH_CHECK(false, "profiling needs LibTorch 2.x; this is ", TORCH_VERSION);
#endif
}

std::vector<ProfiledEvent> StopProfiler(const std::string& trace_path) {
#if TORCH_VERSION_MAJOR >= 2
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  std::vector<ProfiledEvent> events;
  for (const torch::autograd::profiler::KinetoEvent& event : result->events()) {
    events.push_back(
        {event.name(), event.deviceType() != c10::DeviceType::CPU, event.durationNs()});
  }
  return events;
#else
  TORCH_CHECK(false, "profiling needs LibTorch 2.x; this is ", TORCH_VERSION);
#endif
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  return CausalAttentionExplicit(q, k, v);
#endif
}

at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window) {
  const int64_t seq = q.size(-2);
  if (window >= seq) return CausalAttention(q, k, v);
  const at::Tensor positions = at::arange(seq, q.options().dtype(at::kLong));
  const at::Tensor behind = positions.unsqueeze(1) - positions.unsqueeze(0);  // i - j
  const at::Tensor attends = behind.ge(0).logical_and(behind.lt(window));
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, attends);
#else
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  return at::matmul(
      at::softmax(
          scores.masked_fill(attends.logical_not(), -std::numeric_limits<float>::infinity()), -1),
      v);
#endif
}

at::Tensor CausalAttentionExplicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t seq = q.size(-2);
  const at::Tensor above_diagonal =
      at::ones({seq, seq}, q.options().dtype(at::kBool)).triu(/*diagonal=*/1);
  const at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  return at::matmul(
      at::softmax(scores.masked_fill(above_diagonal, -std::numeric_limits<float>::infinity()), -1),
      v);
}

void ReleaseCachedCudaMemory() {
#ifdef KEEL_LIBTORCH_HAS_CUDA
  c10::cuda::CUDACachingAllocator::emptyCache();
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
