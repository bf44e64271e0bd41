// One AdamW step over the parameters of the GPU benchmark's GPT (h1024, 8 layers, ffn 4096,
// vocabulary 256: 100 tensors, 101.2M parameters, float32): FusedAdamW (one _fused_adamw_ per
// device and dtype) beside LibTorch's torch::optim::AdamW (a loop of a dozen kernels per
// parameter), and the memory floor (one read and write pass over parameters, gradients and both
// moments). Every iteration steps on fresh state; the *_cuda cases run on the GPU and skip
// without one.
//
//   bazel run -c opt //optim:fused_adamw_benchmark
#include <cstdint>
#include <memory>
#include <vector>

#include "ATen/ATen.h"
#include "benchmark/benchmark.h"
#include "optim/fused_adamw.h"
#include "torch/cuda.h"
#include "torch/optim/adamw.h"

namespace keel::optim {
namespace {

std::vector<at::Tensor> MakeParams(at::DeviceType device) {
  constexpr int64_t kHidden = 1024, kFfn = 4096, kLayers = 8;
  std::vector<std::vector<int64_t>> shapes = {{256, kHidden}, {512, kHidden}};
  for (int64_t l = 0; l < kLayers; ++l) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{kHidden},
                                           {kHidden},
                                           {3 * kHidden, kHidden},
                                           {3 * kHidden},
                                           {kHidden, kHidden},
                                           {kHidden},
                                           {kHidden},
                                           {kHidden},
                                           {kFfn, kHidden},
                                           {kFfn},
                                           {kHidden, kFfn},
                                           {kHidden}}) {
      shapes.push_back(shape);
    }
  }
  shapes.push_back({kHidden});
  shapes.push_back({kHidden});
  at::manual_seed(0);
  std::vector<at::Tensor> params;
  for (const std::vector<int64_t>& shape : shapes) {
    at::Tensor p = (at::randn(shape) * 0.02).to(device).requires_grad_(true);
    p.mutable_grad() = at::randn(shape).to(device);
    params.push_back(p);
  }
  return params;
}

bool HasDevice(benchmark::State& state, at::DeviceType device) {
  if (device != at::kCUDA || torch::cuda::is_available()) return true;
  state.SkipWithError("needs a GPU");
  return false;
}

void Synchronize(at::DeviceType device) {
  if (device == at::kCUDA) torch::cuda::synchronize();
}

int64_t StepBytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;  // read and write the parameter and both moments, read the gradient
  for (const at::Tensor& p : params) bytes += 7 * p.nbytes();
  return bytes;
}

torch::optim::AdamWOptions Options() {
  return torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1);
}

template <typename MakeOptimizer>
void RunSteps(benchmark::State& state, at::DeviceType device, MakeOptimizer make) {
  if (!HasDevice(state, device)) return;
  const std::vector<at::Tensor> params = MakeParams(device);
  std::unique_ptr<torch::optim::Optimizer> optimizer = make(params);
  optimizer->step();  // the state exists before the timed steps
  Synchronize(device);
  for (auto _ : state) {
    optimizer->step();
    Synchronize(device);
  }
  state.SetBytesProcessed(state.iterations() * StepBytes(params));
}

void BM_TorchAdamW(benchmark::State& state, at::DeviceType device) {
  RunSteps(state, device, [](const std::vector<at::Tensor>& params) {
    return std::make_unique<torch::optim::AdamW>(params, Options());
  });
}

void BM_FusedAdamW(benchmark::State& state, at::DeviceType device) {
  RunSteps(state, device, [](const std::vector<at::Tensor>& params) {
    return std::unique_ptr<torch::optim::Optimizer>(*FusedAdamW::Create(params, Options()));
  });
}

// The bytes a step must move, as one pass: parameters, moments and gradients read, the first
// three written (a copy of 3.5 times the parameters' bytes, read plus written).
void BM_ReadWriteFloor(benchmark::State& state, at::DeviceType device) {
  if (!HasDevice(state, device)) return;
  const std::vector<at::Tensor> params = MakeParams(device);
  int64_t numel = 0;
  for (const at::Tensor& p : params) numel += p.numel();
  const at::Tensor source = at::randn({numel * 7 / 2}).to(device);
  at::Tensor target = at::empty_like(source);
  for (auto _ : state) {
    target.copy_(source);
    Synchronize(device);
  }
  state.SetBytesProcessed(state.iterations() * StepBytes(params));
}

BENCHMARK_CAPTURE(BM_TorchAdamW, cpu, at::kCPU)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedAdamW, cpu, at::kCPU)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_ReadWriteFloor, cuda, at::kCUDA)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_TorchAdamW, cuda, at::kCUDA)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedAdamW, cuda, at::kCUDA)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace keel::optim
