// Per-step cost of the StepScheduler's bookkeeping (grouping, counters, every flag) against
// the same loop over the same micro-batches without it.
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "benchmark/benchmark.h"
#include "scheduling/preemption.h"
#include "scheduling/step_scheduler.h"

namespace keel::scheduling {
namespace {

constexpr int64_t kMicroBatches = 1 << 16;

std::vector<int64_t> MicroBatches() {
  std::vector<int64_t> data(kMicroBatches);
  std::iota(data.begin(), data.end(), 0);
  return data;
}

void BM_PlainLoop(benchmark::State& state) {
  const std::vector<int64_t> data = MicroBatches();
  const int64_t grad_acc = state.range(0);
  for (auto _ : state) {
    int64_t sum = 0;
    for (int64_t i = 0; i < kMicroBatches; i += grad_acc) {
      for (int64_t j = i; j < std::min(i + grad_acc, kMicroBatches); ++j) sum += data[j];
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * kMicroBatches / grad_acc);  // steps
}

void BM_StepScheduler(benchmark::State& state) {
  std::vector<int64_t> data = MicroBatches();
  StepSchedulerOptions options;
  options.global_batch_size = state.range(0);
  options.num_epochs = 1;
  options.ckpt_every_steps = 1000;
  options.val_every_steps = 500;
  options.gc_every_steps = 100;
  options.preemption_signal.reset();
  for (auto _ : state) {
    auto scheduler =
        BuildStepScheduler(options, data, 1, 1, nullptr, std::make_unique<ManualPreemptionFlag>());
    int64_t sum = 0;
    int64_t flags = 0;
    for (auto& batches : *scheduler) {
      for (int64_t b : batches) sum += b;
      flags += scheduler->IsCkptStep() + scheduler->IsValStep() + scheduler->IsLastStep() +
               scheduler->IsGcStep() + scheduler->IsRemoteLoggingStep() +
               scheduler->SigtermReceived();
    }
    benchmark::DoNotOptimize(sum);
    benchmark::DoNotOptimize(flags);
  }
  state.SetItemsProcessed(state.iterations() * kMicroBatches / state.range(0));  // steps
}

BENCHMARK(BM_PlainLoop)->Arg(1)->Arg(8);
BENCHMARK(BM_StepScheduler)->Arg(1)->Arg(8);

}  // namespace
}  // namespace keel::scheduling
