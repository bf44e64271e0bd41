#include "gradients/offload.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "torch/cuda.h"

namespace keel::gradients {
absl::Status MoveToDevice(torch::nn::Module& module, const c10::Device& device) {
  if (device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot move the module to ", device.str(),
                                                      ": this build or machine has no CUDA"));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal,
                                       absl::StrCat("moving the module to ", device.str()), [&] {
                                         // Buffers first: FSDP-style modules may not move them.
                                         for (at::Tensor& buffer : module.buffers()) {
                                           buffer.set_data(buffer.data().to(device));
                                         }
                                         module.to(device);
                                       }));
  base::ReleaseCachedCudaMemory();
  return absl::OkStatus();
}

absl::StatusOr<ScopedModuleOffloading> ScopedModuleOffloading::Enter(torch::nn::Module& module,
                                                                     bool enabled) {
  if (enabled) KEEL_RETURN_IF_ERROR(MoveToDevice(module, c10::Device(c10::DeviceType::CUDA)));
  return ScopedModuleOffloading(&module, enabled);
}

ScopedModuleOffloading::ScopedModuleOffloading(ScopedModuleOffloading&& other) noexcept
    : module_(other.module_), enabled_(other.enabled_) {
  other.enabled_ = false;
}

ScopedModuleOffloading::~ScopedModuleOffloading() { static_cast<void>(Exit()); }

absl::Status ScopedModuleOffloading::Exit() {
  if (!enabled_) return absl::OkStatus();
  enabled_ = false;
  return MoveToDevice(*module_, c10::Device(c10::DeviceType::CPU));
}

}  // namespace keel::gradients
