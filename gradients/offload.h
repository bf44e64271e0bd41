// Moving a module between CPU and CUDA: NeMo AutoModel's move_to_device and
// ScopedModuleOffloading (nemo_automodel/components/training/utils.py).
//
//   {
//     KEEL_ASSIGN_OR_RETURN(auto on_gpu, ScopedModuleOffloading::Enter(reference_model, true));
//     RunReferenceForward();
//   }  // back on the CPU, CUDA cache released
#ifndef KEEL_GRADIENTS_OFFLOAD_H_
#define KEEL_GRADIENTS_OFFLOAD_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "c10/core/Device.h"
#include "torch/nn/module.h"

namespace keel::gradients {

// Moves the module's parameters and buffers to `device`, then releases the CUDA caching
// allocator's unused blocks. Errors: kFailedPrecondition for a CUDA device when this build
// or machine has no CUDA; kInternal if LibTorch fails to move a tensor.
[[nodiscard]] absl::Status MoveToDevice(torch::nn::Module& module, const c10::Device& device);

// While alive and enabled, the module lives on CUDA; the destructor moves it back to the CPU.
// Disabled, it does nothing.
class ScopedModuleOffloading {
 public:
  // Moves `module` to CUDA when `enabled`. Errors: MoveToDevice's.
  // Requires: `module` outlives the returned object.
  [[nodiscard]] static absl::StatusOr<ScopedModuleOffloading> Enter(torch::nn::Module& module,
                                                                    bool enabled);
  ScopedModuleOffloading(ScopedModuleOffloading&& other) noexcept;
  ScopedModuleOffloading& operator=(ScopedModuleOffloading&&) = delete;
  ~ScopedModuleOffloading();

  // Moves the module back to the CPU now (the destructor then does nothing) and reports
  // errors the destructor would have to ignore.
  [[nodiscard]] absl::Status Exit();

 private:
  ScopedModuleOffloading(torch::nn::Module* module, bool enabled)
      : module_(module), enabled_(enabled) {}
  torch::nn::Module* module_;
  bool enabled_;
};

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_OFFLOAD_H_
