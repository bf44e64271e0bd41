// What counting the CPU's tensor memory costs an allocation: an allocate and free of n bytes
// through the counting allocator that TrackTensorMemory installs (base/tensor_memory.h) beside
// the same through LibTorch's own CPU allocator (c10::GetDefaultCPUAllocator), from 256 bytes
// (a scalar's storage) to 16 MiB (an activation).
#include <cstddef>

#include "base/tensor_memory.h"
#include "benchmark/benchmark.h"
#include "c10/core/CPUAllocator.h"

namespace keel::base {
namespace {

void BM_AllocateAndFree(benchmark::State& state, bool counted) {
  TrackTensorMemory(c10::Device(c10::DeviceType::CPU));
  c10::Allocator* allocator = counted ? c10::GetCPUAllocator() : c10::GetDefaultCPUAllocator();
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    c10::DataPtr data = allocator->allocate(bytes);
    benchmark::DoNotOptimize(data.get());
  }
}
BENCHMARK_CAPTURE(BM_AllocateAndFree, libtorch, false)->RangeMultiplier(64)->Range(256, 16 << 20);
BENCHMARK_CAPTURE(BM_AllocateAndFree, counted, true)->RangeMultiplier(64)->Range(256, 16 << 20);

}  // namespace
}  // namespace keel::base
