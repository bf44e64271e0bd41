// Clipping ~150 gradient tensors totalling ~250M elements: Keel (NeMo-exact, fused and foreach
// paths, the last torch.nn.utils.clip_grad_norm_'s multi-tensor kernels)
// side by side with LibTorch's clip_grad_norm_, NeMo's op sequence run op by op, and the memory
// floor (one read pass, and one read+write pass, over the same bytes). Gradients are restored
// outside the timed region, so every iteration really clips. The *_cuda cases run the same on the
// GPU, beside a device-to-device copy of the gradients' bytes (the floor there), and skip without
// one.
#include <cstdint>
#include <cstring>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "benchmark/benchmark.h"
#include "gradients/clip_grad_norm.h"
#include "torch/cuda.h"
#include "torch/nn/utils/clip_grad.h"

namespace keel::gradients {
namespace {

struct Grads {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> originals;
  int64_t bytes = 0;
};

// 60 x [4096, 896] + 30 x [1M] + 60 x [4096]: 150 tensors, 250.4M elements.
Grads& MakeGrads(at::ScalarType dtype, at::DeviceType device = at::kCPU) {
  static Grads* cached = nullptr;
  static at::ScalarType cached_dtype = at::kFloat;
  static at::DeviceType cached_device = at::kCPU;
  if (cached != nullptr && cached_dtype == dtype && cached_device == device) return *cached;
  delete cached;
  cached = new Grads;
  cached_dtype = dtype;
  cached_device = device;
  at::manual_seed(0);
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < 60; ++i) shapes.push_back({4096, 896});
  for (int i = 0; i < 30; ++i) shapes.push_back({1 << 20});
  for (int i = 0; i < 60; ++i) shapes.push_back({4096});
  for (const auto& shape : shapes) {
    at::Tensor param =
        at::zeros(shape, at::TensorOptions(dtype).device(device)).requires_grad_(true);
    param.mutable_grad() = at::randn(shape, dtype).to(device);
    cached->originals.push_back(param.grad().clone());
    cached->params.push_back(param);
    cached->bytes += param.grad().nbytes();
  }
  return *cached;
}

void Restore(benchmark::State& state, Grads& grads) {
  state.PauseTiming();
  for (size_t i = 0; i < grads.params.size(); ++i) grads.params[i].grad().copy_(grads.originals[i]);
  state.ResumeTiming();
}

void BM_ReadFloor(benchmark::State& state, at::ScalarType dtype) {
  Grads& grads = MakeGrads(dtype);
  for (auto _ : state) {
    uint64_t x = 0;
    for (const at::Tensor& p : grads.params) {
      const auto* words = static_cast<const uint64_t*>(p.grad().data_ptr());
      const int64_t n = p.grad().nbytes() / 8;
      x ^= at::parallel_reduce(
          0, n, int64_t{1} << 16, uint64_t{0},
          [words](int64_t b, int64_t e, uint64_t acc) {
            // Four independent lanes: memory, not latency, bounds it.
            uint64_t l0 = 0, l1 = 0, l2 = 0, l3 = 0;
            int64_t i = b;
            for (; i + 4 <= e; i += 4) {
              l0 ^= words[i];
              l1 ^= words[i + 1];
              l2 ^= words[i + 2];
              l3 ^= words[i + 3];
            }
            for (; i < e; ++i) acc ^= words[i];
            return acc ^ l0 ^ l1 ^ l2 ^ l3;
          },
          [](uint64_t a, uint64_t b) { return a ^ b; });
    }
    benchmark::DoNotOptimize(x);
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

void BM_ReadWriteFloor(benchmark::State& state, at::ScalarType dtype) {
  Grads& grads = MakeGrads(dtype);
  for (auto _ : state) {
    for (const at::Tensor& p : grads.params) {
      auto* words = static_cast<uint64_t*>(p.grad().data_ptr());
      at::parallel_for(0, p.grad().nbytes() / 8, int64_t{1} << 16, [words](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) words[i] ^= 1;  // flips one mantissa bit, twice per pair
      });
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

// False (and the benchmark skipped) when `device` is CUDA and there is no GPU.
bool HasDevice(benchmark::State& state, at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// Waits for the GPU's queued work, so that a timed iteration includes it.
void Synchronize(at::DeviceType device) {
  if (device == at::kCUDA) torch::cuda::synchronize();
}

void BM_CopyFloor(benchmark::State& state, at::ScalarType dtype, at::DeviceType device) {
  if (!HasDevice(state, device)) return;
  Grads& grads = MakeGrads(dtype, device);
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : grads.params) copies.push_back(at::empty_like(p.grad()));
  for (auto _ : state) {
    for (size_t i = 0; i < copies.size(); ++i) copies[i].copy_(grads.params[i].grad());
    Synchronize(device);
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

void BM_TorchClipGradNorm(benchmark::State& state, at::ScalarType dtype, at::DeviceType device) {
  if (!HasDevice(state, device)) return;
  Grads& grads = MakeGrads(dtype, device);
  for (auto _ : state) {
    benchmark::DoNotOptimize(torch::nn::utils::clip_grad_norm_(grads.params, 1.0));
    Synchronize(device);
    Restore(state, grads);
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

// NeMo's op sequence run by ATen, one op at a time (what Keel's exact path computes bit for bit,
// and what it ran before its one-pass kernel).
void BM_NemoOpSequence(benchmark::State& state, at::ScalarType dtype) {
  Grads& grads = MakeGrads(dtype);
  for (auto _ : state) {
    at::Tensor max = at::zeros({}, at::kDouble);
    for (const at::Tensor& p : grads.params) {
      max = at::maximum(max, p.grad().abs().max().to(at::kDouble));
    }
    const at::Tensor scale =
        at::where(at::isfinite(max).logical_and(max.ne(0)), max, at::ones_like(max));
    at::Tensor sum = at::zeros({}, at::kDouble);
    for (const at::Tensor& p : grads.params) {
      sum = sum + p.grad().abs().div(scale).square().sum(at::kDouble);
    }
    const at::Tensor coef = ((max * sum.sqrt()) + 1e-6).reciprocal().mul(1.0).clamp_max(1.0);
    for (const at::Tensor& p : grads.params) p.grad().mul_(coef);
    Restore(state, grads);
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

void BM_KeelClipGradNorm(benchmark::State& state, at::ScalarType dtype, at::DeviceType device,
                         NormAlgorithm algorithm) {
  if (!HasDevice(state, device)) return;
  Grads& grads = MakeGrads(dtype, device);
  std::vector<NamedParameter> params;
  for (const at::Tensor& p : grads.params) params.push_back({"w", p});
  ClipGradNormOptions options;
  options.algorithm = algorithm;
  for (auto _ : state) {
    benchmark::DoNotOptimize(ClipGradNorm(1.0, params, options));
    Synchronize(device);
    Restore(state, grads);
  }
  state.SetBytesProcessed(state.iterations() * grads.bytes);
}

BENCHMARK_CAPTURE(BM_ReadFloor, float32, at::kFloat)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_ReadWriteFloor, float32, at::kFloat)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TorchClipGradNorm, float32, at::kFloat, at::kCPU)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_NemoOpSequence, float32, at::kFloat)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_exact, at::kFloat, at::kCPU, NormAlgorithm::kExact)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_fused, at::kFloat, at::kCPU, NormAlgorithm::kFused)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_foreach, at::kFloat, at::kCPU,
                  NormAlgorithm::kForeach)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ReadFloor, bfloat16, at::kBFloat16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ReadWriteFloor, bfloat16, at::kBFloat16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TorchClipGradNorm, bfloat16, at::kBFloat16, at::kCPU)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, bfloat16_exact, at::kBFloat16, at::kCPU,
                  NormAlgorithm::kExact)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, bfloat16_fused, at::kBFloat16, at::kCPU,
                  NormAlgorithm::kFused)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, bfloat16_foreach, at::kBFloat16, at::kCPU,
                  NormAlgorithm::kForeach)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CopyFloor, float32_cuda, at::kFloat, at::kCUDA)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TorchClipGradNorm, float32_cuda, at::kFloat, at::kCUDA)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_exact_cuda, at::kFloat, at::kCUDA,
                  NormAlgorithm::kExact)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_fused_cuda, at::kFloat, at::kCUDA,
                  NormAlgorithm::kFused)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, float32_foreach_cuda, at::kFloat, at::kCUDA,
                  NormAlgorithm::kForeach)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CopyFloor, bfloat16_cuda, at::kBFloat16, at::kCUDA)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TorchClipGradNorm, bfloat16_cuda, at::kBFloat16, at::kCUDA)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, bfloat16_fused_cuda, at::kBFloat16, at::kCUDA,
                  NormAlgorithm::kFused)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_KeelClipGradNorm, bfloat16_foreach_cuda, at::kBFloat16, at::kCUDA,
                  NormAlgorithm::kForeach)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace keel::gradients
