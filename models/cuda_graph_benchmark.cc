// Whether CUDA graphs would pay for Keel's training step (issue 46's item 4, kept only if they
// pay): one micro-batch's forward, loss and backward through a bf16 model on one GPU, launched
// op by op as the trainer launches them (eager), beside the same work captured once in a CUDA
// graph (at::cuda::CUDAGraph, after warm-up on the capturing stream) and replayed. Each
// iteration ends in a synchronisation, as the trainer's step ends in its one read of the loss,
// so the difference is what a graph saves: the host's dispatch of every kernel and the gaps it
// leaves between them. The optimizer's one fused launch a step is left out. The graph's loss and
// gradients are checked against the eager pass's on the same batch before timing.
//
// Shapes: GPT-2 124M and the GPT-2-sized Llama (tools/scripts/gpu_benchmark.sh's gpt2 and
// llama), micro-batches of 16 x 1024. The *_cuda cases skip without a GPU; the CPU case runs
// the eager pass of a small GPT (no graph: CUDA graphs need a GPU).
//
//   bazel run --config=cuda -c opt //models:cuda_graph_benchmark -- --benchmark_filter=cuda
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "models/language_model.h"
#include "models/model_options.h"
#include "models/registry.h"
#include "torch/cuda.h"

#ifdef KEEL_LIBTORCH_HAS_CUDA
#include "ATen/cuda/CUDAGraph.h"
#include "c10/cuda/CUDAGuard.h"
#include "c10/cuda/CUDAStream.h"
#endif  // KEEL_LIBTORCH_HAS_CUDA

namespace keel::models {
namespace {

enum class Shape { kSmall, kGpt2, kLlama };

ModelOptions OptionsOf(Shape shape) {
  ModelOptions options;
  if (shape == Shape::kSmall) return options;  // the trainer's default GPT
  options.hidden_size = 768;
  options.num_layers = 12;
  options.num_attention_heads = 12;
  options.vocab_size = 50304;
  options.max_sequence_length = 1024;
  options.ffn_hidden_size = 3072;
  if (shape == Shape::kLlama) {
    options.family = ModelFamily::kLlama;
    options.num_query_groups = 4;
    options.ffn_hidden_size = 2048;
  }
  return options;
}

// A model of `shape` in bf16 on `device` (float32 on the CPU), and a fixed batch for it.
struct Bench {
  std::shared_ptr<LanguageModel> model;
  at::Tensor tokens;
  at::Tensor labels;

  Bench(Shape shape, const at::Device& device, int64_t batch) {
    const ModelOptions options = OptionsOf(shape);
    model = BuildLanguageModel(options, {});
    model->to(device);
    if (device.is_cuda()) model->to(at::kBFloat16);
    const auto on = at::TensorOptions(at::kLong).device(device);
    tokens = at::randint(options.vocab_size, {batch, options.max_sequence_length}, on);
    labels = at::randint(options.vocab_size, {batch, options.max_sequence_length}, on);
  }

  // The trainer's micro-batch: the summed token losses, backpropagated into fresh gradients.
  at::Tensor Pass() {
    for (at::Tensor& p : model->parameters()) p.mutable_grad().reset();
    const at::Tensor loss = model->TokenLosses(tokens, labels).sum();
    loss.backward();
    return loss.detach();
  }

  int64_t tokens_per_pass() const { return tokens.numel(); }
};

void Count(benchmark::State& state, const Bench& bench) {
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * bench.tokens_per_pass()),
                         benchmark::Counter::kIsRate);
}

void BM_Eager(benchmark::State& state, Shape shape, at::DeviceType device_type) {
  if (device_type == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  at::manual_seed(0);
  const int64_t batch = device_type == at::kCUDA ? 16 : 2;
  Bench bench(shape, at::Device(device_type), batch);
  bench.Pass();  // warm-up: kernels chosen, allocator filled
  for (auto _ : state) {
    bench.Pass();
    if (device_type == at::kCUDA) torch::cuda::synchronize();
  }
  Count(state, bench);
}

#ifdef KEEL_LIBTORCH_HAS_CUDA
// The largest difference between two lists of tensors, relative to the largest magnitude.
double RelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i].to(at::kFloat) - b[i].to(at::kFloat)).abs().max().item<double>());
    scale = std::max(scale, b[i].to(at::kFloat).abs().max().item<double>());
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<at::Tensor> Grads(LanguageModel& model) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void BM_Graph(benchmark::State& state, Shape shape) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  at::manual_seed(0);
  Bench bench(shape, at::Device(at::kCUDA), 16);
  const at::Tensor eager_loss = bench.Pass();
  const std::vector<at::Tensor> eager_grads = Grads(*bench.model);

  // Captured on a stream of its own (not the default one) after warm-up there, the gradients
  // made inside the graph (its memory pool), as torch.cuda.graph's whole-network example does.
  at::cuda::CUDAGraph graph;
  at::Tensor loss;
  torch::cuda::synchronize();
  try {
    {
      const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      for (int i = 0; i < 3; ++i) bench.Pass();
      torch::cuda::synchronize();
      for (at::Tensor& p : bench.model->parameters()) p.mutable_grad().reset();
      graph.capture_begin();
      loss = bench.model->TokenLosses(bench.tokens, bench.labels).sum();
      loss.backward();
      graph.capture_end();
    }
    torch::cuda::synchronize();
    graph.replay();
    torch::cuda::synchronize();
  } catch (const c10::Error& e) {  // what in the pass cannot be captured, for the report
    state.SkipWithError(absl::StrCat("capture failed: ", e.what_without_backtrace()).c_str());
    return;
  }
  const double loss_diff = RelativeDifference({loss}, {eager_loss});
  const double grad_diff = RelativeDifference(Grads(*bench.model), eager_grads);
  // bf16 products may take other kernels in the graph's warm-up than in the first pass.
  if (loss_diff > 1e-3 || grad_diff > 5e-2) {
    state.SkipWithError(absl::StrCat("the graph's pass differs from the eager one: loss by ",
                                     loss_diff, ", gradients by ", grad_diff)
                            .c_str());
    return;
  }
  for (auto _ : state) {
    graph.replay();
    torch::cuda::synchronize();
  }
  state.counters["loss_diff"] = loss_diff;
  state.counters["grad_diff"] = grad_diff;
  Count(state, bench);
}
#else  // a LibTorch without CUDA
void BM_Graph(benchmark::State& state, Shape) {
  state.SkipWithError("a LibTorch without CUDA has no CUDA graphs");
}
#endif

// The graphs last: a capture that fails may leave the device unusable for what follows. Fixed
// iterations, so that each case builds its model (GPT-2 124M: seconds) and captures once.
BENCHMARK_CAPTURE(BM_Eager, small_cpu, Shape::kSmall, at::kCPU)
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Eager, gpt2_cuda, Shape::kGpt2, at::kCUDA)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Eager, llama_cuda, Shape::kLlama, at::kCUDA)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Graph, gpt2_cuda, Shape::kGpt2)->Iterations(30)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Graph, llama_cuda, Shape::kLlama)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace keel::models
