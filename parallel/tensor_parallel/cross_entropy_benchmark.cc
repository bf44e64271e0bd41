// The cross-entropy on one rank, forward and backward, over GPT-2's logits of a micro-batch
// ([16 x 1024, 50304]) and Llama 3's vocabulary ([8 x 1024, 128256]): VocabParallelCrossEntropy
// (bf16 logits on a GPU take Keel's kernels in a --config=cuda build) beside LibTorch's own
// at::cross_entropy_loss over the logits made float32, as a Python loop computes its loss. The
// *_cuda cases skip without a GPU; the CPU case uses a smaller shape.
//
// The output layer and the loss together over Llama 3.2 1B's micro-batch ([2 x 2048, 2048]
// hidden states, the [128256, 2048] output weight): LinearCrossEntropy over chunks of 1024
// positions (the trainer's default at this vocabulary; Keel's kernels on each chunk's bf16
// logits in a --config=cuda build) beside at::linear and at::cross_entropy_loss of the whole
// logits made float32.
#include <cstdint>

#include "ATen/ATen.h"
#include "benchmark/benchmark.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "torch/cuda.h"

namespace keel::parallel {
namespace {

enum class Loss { kKeel, kLibTorch };

// A case's bf16 inputs on `device`, from seed 0: `rows` targets among `vocab` entries and the
// mean's gradient for each position's loss. `skipped` when a *_cuda case has no GPU.
struct Inputs {
  bool skipped = false;
  at::TensorOptions options;
  at::Tensor target, grad;

  Inputs(benchmark::State& state, at::DeviceType device, int64_t rows, int64_t vocab) {
    if (device == at::kCUDA && !torch::cuda::is_available()) {
      state.SkipWithError("no CUDA device");
      skipped = true;
      return;
    }
    at::manual_seed(0);
    options = at::TensorOptions(at::kBFloat16).device(device);
    target = at::randint(vocab, {rows}, options.dtype(at::kLong));
    grad = at::full({rows}, 1.0 / static_cast<double>(rows), options.dtype(at::kFloat));
  }
};

void BM_CrossEntropy(benchmark::State& state, Loss loss, at::DeviceType device, int64_t rows,
                     int64_t vocab) {
  const Inputs in(state, device, rows, vocab);
  if (in.skipped) return;
  const at::Tensor logits = at::randn({rows, vocab}, in.options).mul(4).requires_grad_(true);
  const at::Tensor& target = in.target;
  for (auto _ : state) {
    const at::Tensor losses =
        loss == Loss::kKeel
            ? VocabParallelCrossEntropy(logits, target, nullptr)
            : at::cross_entropy_loss(logits.to(at::kFloat), target, {}, at::Reduction::None);
    losses.backward(in.grad);
    logits.mutable_grad().reset();
    if (device == at::kCUDA) torch::cuda::synchronize();
  }
  // Bytes of the bf16 logits read forward, read and written backward: the floor's traffic.
  state.SetBytesProcessed(state.iterations() * rows * vocab * 6);
}

// Keel's loss and LibTorch's, on `rows` x `vocab` logits: keel_<name> and libtorch_<name>.
#define KEEL_CROSS_ENTROPY_BENCHMARKS(name, device, rows, vocab)                            \
  BENCHMARK_CAPTURE(BM_CrossEntropy, keel_##name, Loss::kKeel, device, rows, vocab)         \
      ->Unit(benchmark::kMillisecond);                                                      \
  BENCHMARK_CAPTURE(BM_CrossEntropy, libtorch_##name, Loss::kLibTorch, device, rows, vocab) \
      ->Unit(benchmark::kMillisecond)

void BM_LinearCrossEntropy(benchmark::State& state, Loss loss, at::DeviceType device, int64_t rows,
                           int64_t width, int64_t vocab) {
  const Inputs in(state, device, rows, vocab);
  if (in.skipped) return;
  const at::Tensor hidden = at::randn({rows, width}, in.options).requires_grad_(true);
  const at::Tensor weight = at::randn({vocab, width}, in.options).mul(0.05).requires_grad_(true);
  const at::Tensor& target = in.target;
  for (auto _ : state) {
    const at::Tensor losses =
        loss == Loss::kKeel
            ? LinearCrossEntropy(hidden, weight, target, nullptr, {/*chunk_len=*/1024, {}})
            : at::cross_entropy_loss(at::linear(hidden, weight).to(at::kFloat), target, {},
                                     at::Reduction::None);
    losses.backward(in.grad);
    hidden.mutable_grad().reset();
    weight.mutable_grad().reset();
    if (device == at::kCUDA) torch::cuda::synchronize();
  }
}

// As KEEL_CROSS_ENTROPY_BENCHMARKS, for the output layer and the loss together.
#define KEEL_LINEAR_CROSS_ENTROPY_BENCHMARKS(name, device, rows, width, vocab)                   \
  BENCHMARK_CAPTURE(BM_LinearCrossEntropy, keel_##name, Loss::kKeel, device, rows, width, vocab) \
      ->Unit(benchmark::kMillisecond);                                                           \
  BENCHMARK_CAPTURE(BM_LinearCrossEntropy, libtorch_##name, Loss::kLibTorch, device, rows,       \
                    width, vocab)                                                                \
      ->Unit(benchmark::kMillisecond)

KEEL_CROSS_ENTROPY_BENCHMARKS(cpu, at::kCPU, 512, 50304);
KEEL_CROSS_ENTROPY_BENCHMARKS(gpt2_cuda, at::kCUDA, 16384, 50304);
KEEL_CROSS_ENTROPY_BENCHMARKS(llama3_cuda, at::kCUDA, 8192, 128256);
KEEL_LINEAR_CROSS_ENTROPY_BENCHMARKS(cpu, at::kCPU, 1024, 256, 32768);
KEEL_LINEAR_CROSS_ENTROPY_BENCHMARKS(llama1b_cuda, at::kCUDA, 4096, 2048, 128256);

}  // namespace
}  // namespace keel::parallel
