// Causal self-attention, forward and backward: base::CausalAttention (LibTorch's fused
// scaled_dot_product_attention) beside the explicit masked softmax
// (CausalAttentionExplicit: [batch, heads, seq, seq] scores, a mask, a softmax), on the
// attention shapes of the default trainer run and of the GPT that docs/performance.md trains
// on a GPU. The *_cuda cases run the same on the GPU (and in bfloat16), and skip without one.
// Grouped-query attention (the GPT-2-sized Llama's 12 query heads over 4 key-value heads):
// k and v as they are, in the fused kernel's grouped mode, beside k and v repeated to the query
// heads first (HF's repeat_kv, what Keel did before).
#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "base/attention.h"
#include "base/attention_reference.h"
#include "benchmark/benchmark.h"
#include "torch/cuda.h"

namespace keel::base {
namespace {

// [batch, heads, seq, head_dim] of one micro-batch.
struct Shape {
  int64_t batch, heads, seq, head_dim;
};
// tools/recipe/default.textproto: micro-batches of 8, 4 heads of 32, 128 positions.
constexpr Shape kDefaultRun{8, 4, 128, 32};
// h1024 with 16 heads over 512 positions, micro-batches of 8 (2 on the CPU).
constexpr Shape kGpuGpt{8, 16, 512, 64};
constexpr Shape kGpuGptOnCpu{2, 16, 512, 64};

using Attention = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&);

void BM_Attention(benchmark::State& state, Attention attention, Shape shape, at::ScalarType dtype,
                  at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  at::manual_seed(0);
  const auto options = at::TensorOptions(dtype).device(device);
  std::vector<at::Tensor> qkv;
  for (int i = 0; i < 3; ++i) {
    qkv.push_back(at::randn({shape.batch, shape.heads, shape.seq, shape.head_dim}, options)
                      .requires_grad_(true));
  }
  const at::Tensor grad_out = at::randn_like(qkv[0]);
  for (auto _ : state) {
    const at::Tensor out = attention(qkv[0], qkv[1], qkv[2]);
    out.backward(grad_out);
    if (device == at::kCUDA) torch::cuda::synchronize();
    for (at::Tensor& t : qkv) t.mutable_grad().reset();
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * shape.batch * shape.seq),
                         benchmark::Counter::kIsRate);
}

#define KEEL_ATTENTION_BENCHMARKS(name, shape, dtype, device)                                      \
  BENCHMARK_CAPTURE(BM_Attention, name##_fused, &CausalAttention, shape, dtype, device)            \
      ->Unit(benchmark::kMillisecond)                                                              \
      ->UseRealTime();                                                                             \
  BENCHMARK_CAPTURE(BM_Attention, name##_explicit, &CausalAttentionExplicit, shape, dtype, device) \
      ->Unit(benchmark::kMillisecond)                                                              \
      ->UseRealTime()

// k and v [batch, heads / 3, seq, head_dim]: grouped as they are, or repeated to q's heads.
void BM_GroupedAttention(benchmark::State& state, bool repeat, Shape shape, at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  at::manual_seed(0);
  const auto options = at::TensorOptions(at::kBFloat16).device(device);
  const int64_t group = 3;
  const at::Tensor q = at::randn({shape.batch, shape.heads, shape.seq, shape.head_dim}, options)
                           .requires_grad_(true);
  const at::Tensor k =
      at::randn({shape.batch, shape.heads / group, shape.seq, shape.head_dim}, options)
          .requires_grad_(true);
  const at::Tensor v = at::randn_like(k).requires_grad_(true);
  const at::Tensor grad_out = at::randn_like(q);
  for (auto _ : state) {
    const at::Tensor out =
        repeat ? CausalAttention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
               : CausalAttention(q, k, v);
    out.backward(grad_out);
    if (device == at::kCUDA) torch::cuda::synchronize();
    for (const at::Tensor& t : {q, k, v}) t.mutable_grad().reset();
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * shape.batch * shape.seq),
                         benchmark::Counter::kIsRate);
}

// The GPT-2-sized Llama's micro-batch: 16 x 1024 positions, 12 query heads of 64 (2 rows on the
// CPU).
constexpr Shape kGpuLlama{16, 12, 1024, 64};
constexpr Shape kGpuLlamaOnCpu{2, 12, 1024, 64};

// llama_grouped<suffix> and llama_repeated<suffix>.
#define KEEL_GROUPED_ATTENTION_BENCHMARKS(suffix, shape, device)                      \
  BENCHMARK_CAPTURE(BM_GroupedAttention, llama_grouped##suffix, false, shape, device) \
      ->Unit(benchmark::kMillisecond)                                                 \
      ->UseRealTime();                                                                \
  BENCHMARK_CAPTURE(BM_GroupedAttention, llama_repeated##suffix, true, shape, device) \
      ->Unit(benchmark::kMillisecond)                                                 \
      ->UseRealTime()

KEEL_GROUPED_ATTENTION_BENCHMARKS(, kGpuLlamaOnCpu, at::kCPU);
KEEL_GROUPED_ATTENTION_BENCHMARKS(_cuda, kGpuLlama, at::kCUDA);

KEEL_ATTENTION_BENCHMARKS(default_run_float32, kDefaultRun, at::kFloat, at::kCPU);
KEEL_ATTENTION_BENCHMARKS(gpu_gpt_float32, kGpuGptOnCpu, at::kFloat, at::kCPU);
KEEL_ATTENTION_BENCHMARKS(default_run_float32_cuda, kDefaultRun, at::kFloat, at::kCUDA);
KEEL_ATTENTION_BENCHMARKS(gpu_gpt_float32_cuda, kGpuGpt, at::kFloat, at::kCUDA);
KEEL_ATTENTION_BENCHMARKS(gpu_gpt_bfloat16_cuda, kGpuGpt, at::kBFloat16, at::kCUDA);

}  // namespace
}  // namespace keel::base
