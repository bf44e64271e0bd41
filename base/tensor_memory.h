// How much tensor memory a device holds at most: torch.cuda.max_memory_allocated's count
// (bytes of live tensors, not what the allocator or the C heap keeps around them), on the CPU
// too. On CUDA it reads the caching allocator's statistics. On the CPU LibTorch keeps no such
// count, so TrackTensorMemory puts a counting allocator in front of LibTorch's own (once per
// process; tensors allocated before it are not counted).
//
//   keel::base::TrackTensorMemory(device);   // before the model and its state are built
//   ... training steps ...
//   int64_t peak = keel::base::TakePeakTensorMemory(device);  // since the last take
//   int64_t most = keel::base::DeviceMemoryCapacity(device);   // what the device has
#ifndef KEEL_BASE_TENSOR_MEMORY_H_
#define KEEL_BASE_TENSOR_MEMORY_H_

#include <cstdint>

#include "c10/core/Device.h"

namespace keel::base {

// Starts counting `device`'s tensor memory: on the CPU, from this call on, process-wide (every
// thread's CPU tensors); on CUDA, the caching allocator counts already. Nothing for other
// device types.
void TrackTensorMemory(const c10::Device& device);

// Bytes of tensors allocated on `device` and not yet freed (torch.cuda.memory_allocated); 0
// on a CPU that TrackTensorMemory has not been called for.
int64_t TensorMemory(const c10::Device& device);

// The most bytes of tensors held at once on `device` since the previous take, or since tracking
// began (torch.cuda.max_memory_allocated), then starts the next interval from what is held now
// (reset_peak_memory_stats). 0 where TensorMemory is.
int64_t TakePeakTensorMemory(const c10::Device& device);

// The most bytes `device` can hold: a CUDA device's memory (CudaTotalMemory), or for the CPU
// the machine's RAM and swap (sysinfo(2); a container's own limit may be lower); 0 where
// unknown (other device types, a LibTorch built without CUDA).
int64_t DeviceMemoryCapacity(const c10::Device& device);

}  // namespace keel::base

#endif  // KEEL_BASE_TENSOR_MEMORY_H_
