#include "base/tensor_memory.h"

#include <sys/sysinfo.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "base/torch_compat.h"
#include "c10/core/Allocator.h"
#include "c10/core/CPUAllocator.h"
#include "c10/core/alignment.h"

namespace keel::base {
namespace {

// LibTorch's CPU allocator with a count in front: each allocation carries its size in a header
// of one alignment unit before the data, so the data pointer is its own context (raw_allocate
// and copy-on-write clones keep working) and freeing needs no lookup.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static CountingCpuAllocator& Get() {
    // Never destroyed: tensors that outlive main still free through it.
    static auto* allocator = new CountingCpuAllocator(c10::GetCPUAllocator());
    return *allocator;
  }

  c10::DataPtr allocate(size_t n) override {
    auto* base = static_cast<char*>(inner_->raw_allocate(n + kHeader));
    *reinterpret_cast<size_t*>(base) = n;
    const int64_t held = held_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (held > peak && !peak_.compare_exchange_weak(peak, held)) {
    }
    void* data = base + kHeader;
    return {data, data, &Free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Free; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t held() const { return held_.load(); }
  int64_t TakePeak() { return peak_.exchange(held_.load()); }

 private:
  static constexpr size_t kHeader = c10::gAlignment;
  static_assert(kHeader >= sizeof(size_t), "the header holds the size");

  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  static void Free(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    CountingCpuAllocator& self = Get();
    self.held_.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
    self.inner_->raw_deallocate(base);
  }

  c10::Allocator* inner_;
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> peak_{0};
};

// Whether TrackTensorMemory has put the counting allocator in place.
std::atomic<bool> cpu_tracked{false};

}  // namespace

void TrackTensorMemory(const c10::Device& device) {
  if (!device.is_cpu()) return;
  static std::once_flag once;
  std::call_once(once, [] {
    // Above the default allocator's priority (0), so nothing registered later at 0 displaces it.
    c10::SetCPUAllocator(&CountingCpuAllocator::Get(), /*priority=*/1);
    cpu_tracked = true;
  });
}

int64_t TensorMemory(const c10::Device& device) {
  if (device.is_cuda()) return CudaMemoryAllocated(device.index());
  return device.is_cpu() && cpu_tracked ? CountingCpuAllocator::Get().held() : 0;
}

int64_t TakePeakTensorMemory(const c10::Device& device) {
  if (device.is_cuda()) return TakeCudaPeakMemoryAllocated(device.index());
  return device.is_cpu() && cpu_tracked ? CountingCpuAllocator::Get().TakePeak() : 0;
}

int64_t DeviceMemoryCapacity(const c10::Device& device) {
  if (device.is_cuda()) return CudaTotalMemory(device.index());
  struct sysinfo info {};
  if (!device.is_cpu() || sysinfo(&info) != 0) return 0;
  return static_cast<int64_t>(info.totalram + info.totalswap) * info.mem_unit;
}

}  // namespace keel::base
