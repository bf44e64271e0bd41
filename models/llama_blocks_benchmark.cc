// The Llama's elementwise blocks, forward and backward, beside Hugging Face's op-by-op forms
// (models/hf_reference.h, what Keel ran before): RmsNorm (LibTorch's fused kernel without a
// weight, then the weight) over a micro-batch of the GPT-2-sized Llama's residual stream
// ([16 x 1024, 768]), and ApplyRotary (one flip of the halves, a signed sine table) over its q
// ([16, 12 heads, 1024, 64], transposed as the attention hands it over), and SwiGlu (silu(gate)
// made again in backward, not kept) over its MLP's gate and up ([16 x 1024, 2048] each, views
// of the one gate-up product). bf16 as a GPU trains; the CPU cases run 2 rows of the batch, the
// *_cuda cases the whole and skip without a GPU.
#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "benchmark/benchmark.h"
#include "models/gated_mlp.h"
#include "models/hf_reference.h"
#include "models/rms_norm.h"
#include "models/rotary.h"
#include "torch/cuda.h"

namespace keel::models {
namespace {

enum class Form { kKeel, kHf };

constexpr int64_t kHidden = 768, kHeads = 12, kHeadDim = 64, kSeq = 1024, kFfn = 2048;

bool Skip(benchmark::State& state, at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return true;
  }
  return false;
}

void Sync(at::DeviceType device) {
  if (device == at::kCUDA) torch::cuda::synchronize();
}

void BM_RmsNorm(benchmark::State& state, Form form, at::DeviceType device, int64_t batch) {
  if (Skip(state, device)) return;
  at::manual_seed(0);
  const auto options = at::TensorOptions(at::kBFloat16).device(device);
  const at::Tensor x = at::randn({batch, kSeq, kHidden}, options).requires_grad_(true);
  const at::Tensor grad = at::randn_like(x);
  RmsNorm norm(kHidden, 1e-5);
  norm->to(device, at::kBFloat16);
  const at::Tensor weight = norm->named_parameters()["weight"];
  for (auto _ : state) {
    const at::Tensor y = form == Form::kKeel ? norm->forward(x) : HfRmsNorm(x, weight, 1e-5);
    y.backward(grad);
    Sync(device);
    x.mutable_grad().reset();
    weight.mutable_grad().reset();
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * batch * kSeq), benchmark::Counter::kIsRate);
}

void BM_Rotary(benchmark::State& state, Form form, at::DeviceType device, int64_t batch) {
  if (Skip(state, device)) return;
  at::manual_seed(0);
  const auto options = at::TensorOptions(at::kBFloat16).device(device);
  const at::Tensor projected =
      at::randn({batch, kSeq, kHeads, kHeadDim}, options).requires_grad_(true);
  const at::Tensor grad = at::randn({batch, kHeads, kSeq, kHeadDim}, options);
  const at::Tensor inv_freq = InverseFrequencies(kHeadDim, RopeOptions{});
  const RotaryTables tables = MakeRotaryTables(inv_freq, kSeq, options);
  HfRotaryTables hf = HfRotary(inv_freq, kSeq, at::kBFloat16);
  hf = {hf.cos.to(device), hf.sin.to(device)};
  for (auto _ : state) {
    const at::Tensor q = projected.transpose(1, 2);
    const at::Tensor y = form == Form::kKeel ? ApplyRotary(q, tables) : HfApplyRotary(q, hf);
    y.backward(grad);
    Sync(device);
    projected.mutable_grad().reset();
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * batch * kSeq), benchmark::Counter::kIsRate);
}

void BM_SwiGlu(benchmark::State& state, Form form, at::DeviceType device, int64_t batch) {
  if (Skip(state, device)) return;
  at::manual_seed(0);
  const auto options = at::TensorOptions(at::kBFloat16).device(device);
  const at::Tensor gate_up = at::randn({batch, kSeq, 2 * kFfn}, options).requires_grad_(true);
  const at::Tensor grad = at::randn({batch, kSeq, kFfn}, options);
  for (auto _ : state) {
    const std::vector<at::Tensor> halves = gate_up.split(kFfn, -1);
    const at::Tensor y =
        form == Form::kKeel ? SwiGlu(halves[0], halves[1]) : HfSwiGlu(halves[0], halves[1]);
    y.backward(grad);
    Sync(device);
    gate_up.mutable_grad().reset();
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * batch * kSeq), benchmark::Counter::kIsRate);
}

#define KEEL_BLOCK_BENCHMARKS(block)                                   \
  BENCHMARK_CAPTURE(BM_##block, keel_cpu, Form::kKeel, at::kCPU, 2)    \
      ->Unit(benchmark::kMillisecond)                                  \
      ->UseRealTime();                                                 \
  BENCHMARK_CAPTURE(BM_##block, hf_cpu, Form::kHf, at::kCPU, 2)        \
      ->Unit(benchmark::kMillisecond)                                  \
      ->UseRealTime();                                                 \
  BENCHMARK_CAPTURE(BM_##block, keel_cuda, Form::kKeel, at::kCUDA, 16) \
      ->Unit(benchmark::kMillisecond)                                  \
      ->UseRealTime();                                                 \
  BENCHMARK_CAPTURE(BM_##block, hf_cuda, Form::kHf, at::kCUDA, 16)     \
      ->Unit(benchmark::kMillisecond)                                  \
      ->UseRealTime()

KEEL_BLOCK_BENCHMARKS(RmsNorm);
KEEL_BLOCK_BENCHMARKS(Rotary);
KEEL_BLOCK_BENCHMARKS(SwiGlu);

}  // namespace
}  // namespace keel::models
