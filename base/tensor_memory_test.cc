#include "base/tensor_memory.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <thread>

#include "ATen/ATen.h"
#include "c10/core/CPUAllocator.h"
#include "gtest/gtest.h"
#include "torch/cuda.h"

namespace keel::base {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
const c10::Device kCpu(c10::DeviceType::CPU);

// A float32 tensor of `bytes` bytes.
at::Tensor Bytes(int64_t bytes) { return at::empty({bytes / 4}, at::kFloat); }

TEST(TensorMemoryTest, CountsCpuTensorsFromTrackingOn) {
  TrackTensorMemory(kCpu);
  const int64_t held = TensorMemory(kCpu);
  at::Tensor tensor = Bytes(kMiB);
  EXPECT_EQ(TensorMemory(kCpu), held + kMiB);
  at::Tensor view = tensor.view({2, -1});  // shares the storage: nothing more
  EXPECT_EQ(TensorMemory(kCpu), held + kMiB);
  tensor.reset();
  EXPECT_EQ(TensorMemory(kCpu), held + kMiB);
  view.reset();
  EXPECT_EQ(TensorMemory(kCpu), held);
}

TEST(TensorMemoryTest, PeakIsTheMostHeldAtOnceSinceTheLastTake) {
  TrackTensorMemory(kCpu);
  TakePeakTensorMemory(kCpu);
  const int64_t held = TensorMemory(kCpu);
  at::Tensor a = Bytes(kMiB);
  at::Tensor b = Bytes(2 * kMiB);
  a.reset();
  b.reset();
  at::Tensor c = Bytes(kMiB / 2);
  EXPECT_EQ(TakePeakTensorMemory(kCpu), held + 3 * kMiB);
  // The next interval starts from what is held now.
  EXPECT_EQ(TakePeakTensorMemory(kCpu), held + kMiB / 2);
  c.reset();
  EXPECT_EQ(TakePeakTensorMemory(kCpu), held + kMiB / 2);
  EXPECT_EQ(TakePeakTensorMemory(kCpu), held);
}

TEST(TensorMemoryTest, CountsEveryThreadsTensors) {
  TrackTensorMemory(kCpu);
  TakePeakTensorMemory(kCpu);
  const int64_t held = TensorMemory(kCpu);
  std::thread([] { at::Tensor tensor = Bytes(4 * kMiB); }).join();
  EXPECT_EQ(TensorMemory(kCpu), held);
  EXPECT_EQ(TakePeakTensorMemory(kCpu), held + 4 * kMiB);
}

TEST(TensorMemoryTest, KeepsRawAllocationsAndCopyOnWriteClonesWorking) {
  TrackTensorMemory(kCpu);
  const int64_t held = TensorMemory(kCpu);
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(1000);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(TensorMemory(kCpu), held + 1000);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(TensorMemory(kCpu), held);

  at::Tensor source = at::arange(1024, at::kFloat);
  at::Tensor clone = at::_lazy_clone(source);  // shares the storage until written
  EXPECT_EQ(TensorMemory(kCpu), held + 4096);
  clone.add_(1);  // materialises its own copy
  EXPECT_EQ(TensorMemory(kCpu), held + 2 * 4096);
  EXPECT_TRUE(at::equal(clone - 1, source));
  source.reset();
  clone.reset();
  EXPECT_EQ(TensorMemory(kCpu), held);
}

TEST(TensorMemoryTest, OtherDeviceTypesCountNothing) {
  const c10::Device meta(c10::DeviceType::Meta);
  TrackTensorMemory(meta);
  at::Tensor tensor = at::empty({1024}, at::TensorOptions().device(meta));
  EXPECT_EQ(TensorMemory(meta), 0);
  EXPECT_EQ(TakePeakTensorMemory(meta), 0);
}

// The kernel's own account of the machine, /proc/meminfo, read apart from sysinfo(2).
TEST(TensorMemoryTest, TheCpuHoldsTheMachinesRamAndSwap) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  int64_t total = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:" || key == "SwapTotal:") total += kib * 1024;
  }
  ASSERT_GT(total, 0) << "/proc/meminfo has no MemTotal";
  EXPECT_EQ(DeviceMemoryCapacity(kCpu), total);
  EXPECT_EQ(DeviceMemoryCapacity(c10::Device(c10::DeviceType::Meta)), 0);
}

TEST(TensorMemoryTest, ReadsTheCudaCachingAllocator) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: the CUDA count is not checked here";
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  TrackTensorMemory(cuda);
  TakePeakTensorMemory(cuda);
  const int64_t held = TensorMemory(cuda);
  {
    at::Tensor tensor = at::empty({kMiB}, at::TensorOptions().dtype(at::kByte).device(cuda));
    EXPECT_EQ(TensorMemory(cuda), held + kMiB);
  }
  EXPECT_EQ(TensorMemory(cuda), held);
  EXPECT_EQ(TakePeakTensorMemory(cuda), held + kMiB);
  EXPECT_EQ(TakePeakTensorMemory(cuda), held);
  // Every GPU Keel trains on has gigabytes; what is held fits in them.
  EXPECT_GT(DeviceMemoryCapacity(cuda), int64_t{1} << 30);
  EXPECT_GT(DeviceMemoryCapacity(cuda), held);
}

}  // namespace
}  // namespace keel::base
