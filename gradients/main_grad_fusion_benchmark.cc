// Megatron's gradient_accumulation_fusion, measured: a bf16 layer's forward and backward into
// float32 main gradients (DataParallelGradSync::CreateLocal), fused (Keel's layers add the
// weight-gradient product into the main gradient: on a GPU one GEMM accumulating in float32)
// beside unfused (the product in bf16 into .grad, which the sync then adds), for
//   BM_Linear:      a column-parallel layer, GPT-2's MLP fc ([3072, 768] over 16 x 1024 tokens)
//                   on a GPU, [1024, 512] over 2048 tokens on the CPU;
//   BM_ChunkedHead: the output layer and loss over chunks of 1024 positions
//                   (LinearCrossEntropy), Llama 3.2 1B's head ([128256, 2048] over 2 x 2048
//                   tokens) on a GPU, [32768, 256] over 1024 tokens on the CPU, where unfused
//                   the chunks' products are summed in a float32 [vocab, h] tensor, rounded
//                   into a bf16 .grad, then added.
// Counter peak_mib: the step's peak of live tensors above what the model and the sync hold
// (base::TakePeakTensorMemory). The *_cuda cases skip without a GPU.
#include <cstdint>
#include <memory>

#include "ATen/ATen.h"
#include "base/tensor_memory.h"
#include "benchmark/benchmark.h"
#include "gradients/dp_sync.h"
#include "gradients/parameters.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/cuda.h"
#include "torch/nn/module.h"

namespace keel::gradients {
namespace {

enum class Path { kFused, kUnfused };

// One step after another on `module`'s parameters, synchronised locally into float32 main
// gradients: `step` runs forward and backward.
template <typename Step>
void Measure(benchmark::State& state, torch::nn::Module& module, at::DeviceType device, Path path,
             Step step) {
  const at::Device on(device);
  DataParallelGradSyncOptions options;
  options.main_grad_dtype = at::kFloat;
  options.gradient_accumulation_fusion = path == Path::kFused;
  auto sync = DataParallelGradSync::CreateLocal(TrainableParameters({&module}), options);
  if (!sync.ok()) {
    state.SkipWithError(sync.status().ToString().c_str());
    return;
  }
  step();  // warm-up
  if (!(*sync)->Wait().ok()) state.SkipWithError("Wait failed");
  if (device == at::kCUDA) torch::cuda::synchronize();
  const int64_t held = base::TensorMemory(on);
  base::TakePeakTensorMemory(on);
  for (auto _ : state) {
    step();
    if (!(*sync)->Wait().ok()) state.SkipWithError("Wait failed");
    if (device == at::kCUDA) torch::cuda::synchronize();
  }
  state.counters["peak_mib"] =
      static_cast<double>(base::TakePeakTensorMemory(on) - held) / (1024.0 * 1024.0);
}

bool Skipped(benchmark::State& state, at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  base::TrackTensorMemory(at::Device(device));
  at::manual_seed(0);
  return false;
}

void BM_Linear(benchmark::State& state, Path path, at::DeviceType device, int64_t tokens,
               int64_t in, int64_t out) {
  if (Skipped(state, device)) return;
  parallel::ColumnParallelLinear layer(in, out, nullptr);
  layer->to(at::Device(device), at::kBFloat16);
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : layer->parameters()) p.normal_(0, 0.02);
  }
  const at::Tensor x =
      at::randn({tokens, in}, at::TensorOptions(at::kBFloat16).device(device)).requires_grad_(true);
  Measure(state, *layer, device, path, [&] {
    layer->forward(x).sum().backward();
    x.mutable_grad().reset();
  });
}

void BM_ChunkedHead(benchmark::State& state, Path path, at::DeviceType device, int64_t tokens,
                    int64_t width, int64_t vocab) {
  if (Skipped(state, device)) return;
  const at::TensorOptions options = at::TensorOptions(at::kBFloat16).device(device);
  torch::nn::Module head;
  const at::Tensor weight = head.register_parameter(
      "weight", at::randn({vocab, width}, options).mul(0.02));
  const at::Tensor hidden = at::randn({tokens, width}, options).requires_grad_(true);
  const at::Tensor target = at::randint(vocab, {tokens}, options.dtype(at::kLong));
  parallel::LinearCrossEntropyOptions chunked;
  chunked.chunk_len = 1024;
  Measure(state, head, device, path, [&] {
    parallel::LinearCrossEntropy(hidden, weight, target, nullptr, chunked).mean().backward();
    hidden.mutable_grad().reset();
  });
}

#define KEEL_FUSION_BENCHMARKS(bm, name, ...)                                          \
  BENCHMARK_CAPTURE(bm, fused_##name, Path::kFused, __VA_ARGS__)                       \
      ->Unit(benchmark::kMillisecond)                                                  \
      ->UseRealTime();                                                                 \
  BENCHMARK_CAPTURE(bm, unfused_##name, Path::kUnfused, __VA_ARGS__)                   \
      ->Unit(benchmark::kMillisecond)                                                  \
      ->UseRealTime()

KEEL_FUSION_BENCHMARKS(BM_Linear, cpu, at::kCPU, 2048, 512, 1024);
KEEL_FUSION_BENCHMARKS(BM_Linear, gpt2_fc_cuda, at::kCUDA, 16384, 768, 3072);
KEEL_FUSION_BENCHMARKS(BM_ChunkedHead, cpu, at::kCPU, 1024, 256, 32768);
KEEL_FUSION_BENCHMARKS(BM_ChunkedHead, llama1b_cuda, at::kCUDA, 4096, 2048, 128256);

}  // namespace
}  // namespace keel::gradients
