// The one-rank cross-entropy, forward and backward, over GPT-2's logits of a micro-batch
// ([16 x 1024, 50304]) and Llama 3's vocabulary ([8 x 1024, 128256]): VocabParallelCrossEntropy
// (bf16 logits on a GPU take Keel's kernels in a --config=cuda build) beside LibTorch's own
// at::cross_entropy_loss over the logits made float32, as a Python loop computes its loss. The
// *_cuda cases skip without a GPU; the CPU case uses a smaller shape.
#include <cstdint>

#include "ATen/ATen.h"
#include "benchmark/benchmark.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "torch/cuda.h"

namespace keel::parallel {
namespace {

enum class Loss { kKeel, kLibTorch };

void BM_CrossEntropy(benchmark::State& state, Loss loss, at::DeviceType device, int64_t rows,
                     int64_t vocab) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  at::manual_seed(0);
  const auto options = at::TensorOptions(at::kBFloat16).device(device);
  const at::Tensor logits = at::randn({rows, vocab}, options).mul(4).requires_grad_(true);
  const at::Tensor target = at::randint(vocab, {rows}, options.dtype(at::kLong));
  const at::Tensor grad =
      at::full({rows}, 1.0 / static_cast<double>(rows), options.dtype(at::kFloat));
  for (auto _ : state) {
    const at::Tensor losses =
        loss == Loss::kKeel
            ? VocabParallelCrossEntropy(logits, target, nullptr)
            : at::cross_entropy_loss(logits.to(at::kFloat), target, {}, at::Reduction::None);
    losses.backward(grad);
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

KEEL_CROSS_ENTROPY_BENCHMARKS(cpu, at::kCPU, 512, 50304);
KEEL_CROSS_ENTROPY_BENCHMARKS(gpt2_cuda, at::kCUDA, 16384, 50304);
KEEL_CROSS_ENTROPY_BENCHMARKS(llama3_cuda, at::kCUDA, 8192, 128256);

}  // namespace
}  // namespace keel::parallel
