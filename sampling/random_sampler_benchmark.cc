// The random sampler's two permutation modes on one rank that owns the whole dataset (the
// worst case for memory): the cost of starting an epoch (kRandperm materializes
// randperm(bucket): 8 bytes per sample; kFeistel keys a function) and the rate of drawing
// indices within an epoch. The resident-memory counters are measured from /proc.
//
//   bazel run -c opt //sampling:random_sampler_benchmark
//   bazel run -c opt //sampling:random_sampler_benchmark -- --benchmark_filter=Draw
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>

#include "benchmark/benchmark.h"
#include "sampling/megatron_sampler.h"

namespace keel::sampling {
namespace {

constexpr int64_t kMicroBatchSize = 8;
constexpr int64_t kMicroBatchesPerIteration = 1 << 17;  // 2^20 indices

// Resident memory of this process, in bytes.
double ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

std::unique_ptr<MegatronPretrainingRandomSampler> MakeSampler(int64_t total_samples,
                                                              RandomPermutation permutation) {
  PretrainingSamplerOptions options;
  options.total_samples = total_samples;
  options.micro_batch_size = kMicroBatchSize;
  options.data_parallel_size = 1;
  options.random_permutation = permutation;
  return std::move(MegatronPretrainingRandomSampler::Create(options)).value();
}

// Starting an epoch: begin() shuffles (or keys) the bucket and yields the first micro-batch.
void BM_StartEpoch(benchmark::State& state, RandomPermutation permutation) {
  auto sampler = MakeSampler(state.range(0), permutation);
  const double before = ResidentBytes();
  double held = 0;
  for (auto _ : state) {
    auto it = sampler->begin();
    benchmark::DoNotOptimize(it->data());
    state.PauseTiming();
    held = ResidentBytes() - before;
    // Ends the pass (freeing what it holds) and rewinds to epoch 0.
    if (!sampler->LoadState({0, 0, 0}).ok()) state.SkipWithError("LoadState failed");
    state.ResumeTiming();
  }
  state.counters["held_MiB"] = held / (1 << 20);
  state.counters["samples"] = static_cast<double>(state.range(0));
}

// Drawing micro-batches inside an epoch, after it has started; wraps to a new epoch (whose
// start is then included) only when the bucket is smaller than what is drawn.
void BM_Draw(benchmark::State& state, RandomPermutation permutation) {
  auto sampler = MakeSampler(state.range(0), permutation);
  auto it = sampler->begin();
  for (auto _ : state) {
    for (int64_t i = 0; i < kMicroBatchesPerIteration; ++i) {
      ++it;
      if (it == sampler->end()) it = sampler->begin();
      benchmark::DoNotOptimize(it->data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kMicroBatchesPerIteration * kMicroBatchSize);
}

BENCHMARK_CAPTURE(BM_StartEpoch, randperm, RandomPermutation::kRandperm)
    ->Arg(1000000)
    ->Arg(100000000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_StartEpoch, randperm, RandomPermutation::kRandperm)
    ->Arg(1000000000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_StartEpoch, feistel, RandomPermutation::kFeistel)
    ->Arg(1000000)
    ->Arg(100000000)
    ->Arg(1000000000)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(1000);
BENCHMARK_CAPTURE(BM_Draw, randperm, RandomPermutation::kRandperm)
    ->Arg(1000000)
    ->Arg(100000000)
    ->Arg(1000000000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(50);
BENCHMARK_CAPTURE(BM_Draw, feistel, RandomPermutation::kFeistel)
    ->Arg(1000000)
    ->Arg(100000000)
    ->Arg(1000000000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(50);

}  // namespace
}  // namespace keel::sampling
