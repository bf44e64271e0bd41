// The fake GPU's backend: an allocator of host memory that labels its memory with the device;
// the kernels that create, copy, resize and view its tensors; and, for every other operation,
// LibTorch's CPU fallback (its tensors copied to the CPU, the CPU kernel, the results and the
// mutated arguments copied back), which first refuses host tensors beside the fake GPU's.
#include "testing/fake_gpu.h"

#include <cstdlib>
#include <cstring>

#include "ATen/ATen.h"
#include "ATen/EmptyTensor.h"
#include "ATen/native/CPUFallback.h"
#include "ATen/ops/_reshape_alias_native.h"
#include "ATen/ops/as_strided_native.h"
#include "ATen/ops/resize_native.h"
#include "ATen/ops/view_native.h"
#include "c10/core/Allocator.h"
#include "c10/core/impl/DeviceGuardImplInterface.h"
#include "torch/library.h"

namespace keel::testing {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::VE;
constexpr c10::DispatchKey kKey = c10::DispatchKey::VE;
constexpr size_t kAlignment = 64;

void FreeHostMemory(void* data) { std::free(data); }

// This thread's current fake GPU, as CUDA keeps one per thread.
thread_local c10::DeviceIndex current_index = 0;

// Host memory, labelled as the memory of fake GPU `index`.
struct FakeGpuAllocator final : c10::Allocator {
  c10::DeviceIndex index = 0;
  c10::DataPtr Allocate(size_t bytes) const {
    void* data = bytes == 0 ? nullptr
                            : std::aligned_alloc(
                                  kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    return {data, data, &FreeHostMemory, c10::Device(kType, index)};
  }
  c10::DataPtr allocate(size_t bytes) override { return Allocate(bytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &FreeHostMemory; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

// The allocator of `device`'s memory (this thread's current fake GPU without an index).
FakeGpuAllocator* AllocatorOf(const c10::optional<at::Device>& device) {
  static FakeGpuAllocator* const allocators = [] {
    auto* all = new FakeGpuAllocator[kFakeGpus];
    for (c10::DeviceIndex i = 0; i < kFakeGpus; ++i) all[i].index = i;
    return all;
  }();
  const c10::DeviceIndex index =
      device.has_value() && device->has_index() ? device->index() : current_index;
  TORCH_CHECK(index >= 0 && index < kFakeGpus, "no fake GPU ", static_cast<int>(index),
              " (there are ", static_cast<int>(kFakeGpus), ")");
  return &allocators[index];
}

// Device and stream bookkeeping: kFakeGpus devices, the current one per thread, one stream each.
struct FakeGpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_index); }
  void setDevice(c10::Device device) const override { uncheckedSetDevice(device); }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) current_index = device.index();
  }
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kFakeGpus; }
};

// A CPU tensor over the same memory as `tensor` (itself when it is not the fake GPU's).
at::Tensor CpuAlias(const at::Tensor& tensor) {
  if (tensor.device().type() != kType) return tensor;
  c10::Storage storage(c10::Storage::use_byte_size_t(), tensor.storage().nbytes(),
                       c10::DataPtr(tensor.storage().data_ptr().get(), c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(tensor.sizes(), tensor.strides());
  alias.unsafeGetTensorImpl()->set_storage_offset(tensor.storage_offset());
  return alias;
}

at::Tensor Empty(at::IntArrayRef size, c10::optional<at::ScalarType> dtype,
                 c10::optional<at::Layout>, c10::optional<at::Device> device, c10::optional<bool>,
                 c10::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, AllocatorOf(device), c10::DispatchKeySet(kKey),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor EmptyStrided(at::IntArrayRef size, at::IntArrayRef stride,
                        c10::optional<at::ScalarType> dtype, c10::optional<at::Layout>,
                        c10::optional<at::Device> device, c10::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, AllocatorOf(device),
                                           c10::DispatchKeySet(kKey), c10::dtype_or_default(dtype));
}

// Between the CPU and the fake GPU, either way: both are host memory.
at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  CpuAlias(dst).copy_(CpuAlias(self));
  return dst;
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return CopyFrom(self, dst, /*non_blocking=*/false);
}

// Module::to moves parameters with set_data, which needs this between the two devices.
bool CompatibleShallowCopyType(const at::Tensor&, const at::Tensor&) { return true; }

// The fallback would run an operation on host and fake GPU tensors alike; a GPU refuses to
// mix them, as TensorIterator does: every tensor argument on one device, but for 0-d CPU
// tensors (scalars).
void CheckOneDevice(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t count = op.schema().arguments().size();
  bool host = false, device = false;
  const auto visit = [&](const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    if (tensor.device().type() == kType) device = true;
    if (tensor.is_cpu() && tensor.dim() > 0) host = true;
  };
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor()) visit(value.toTensor());
    if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorVector()) visit(tensor);
    }
  }
  TORCH_CHECK(!(host && device),
              "Expected all tensors to be on the same device, but found at "
              "least two devices, ",
              kType, " and cpu! (", op.schema().name(), ")");
}

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  CheckOneDevice(op, *stack);
  at::native::cpu_fallback(op, stack);
}

}  // namespace

at::Device FakeGpu(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kFakeGpus, "no fake GPU ", static_cast<int>(index),
              " (there are ", static_cast<int>(kFakeGpus), ")");
  return at::Device(kType, index);
}

}  // namespace keel::testing

C10_REGISTER_GUARD_IMPL(VE, keel::testing::FakeGpuGuard);

TORCH_LIBRARY_IMPL(aten, VE, m) {
  m.impl("empty.memory_format", TORCH_FN(keel::testing::Empty));
  m.impl("empty_strided", TORCH_FN(keel::testing::EmptyStrided));
  m.impl("_copy_from", TORCH_FN(keel::testing::CopyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(keel::testing::CopyFromAndResize));
  m.impl("resize_", TORCH_FN(at::native::resize_));
  // Views share the viewed tensor's memory, so they cannot take the copying fallback.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(keel::testing::CompatibleShallowCopyType));
}

// The check runs under the autograd key of parameters that require grad.
TORCH_LIBRARY_IMPL(aten, AutogradVE, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(keel::testing::CompatibleShallowCopyType));
}

TORCH_LIBRARY_IMPL(_, VE, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&keel::testing::CpuFallback>());
}
