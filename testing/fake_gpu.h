// A second device for tests on machines without GPUs: tensors on it live in host memory and
// operations run LibTorch's CPU kernels (or, where LibTorch has a generic implementation besides
// the CPU's, that one: layer norm's, say), so results equal the CPU's up to rounding, while to
// LibTorch and to Keel it is another device than the CPU: a host (CPU) tensor and a FakeGpu
// tensor do not mix, modules move to it with Module::to, and autograd runs its backward passes
// on a device thread of its own, as for CUDA. With testing::NcclLikeGroup it proves that code which
// runs on GPUs with NCCL sends no host tensor to a device group.
//
//   at::Tensor x = at::ones({3}).to(keel::testing::FakeGpu());   // "ve:0"
//   model->to(keel::testing::FakeGpu(rank));
//
// It takes the dispatch key and device type of NEC's SX-Aurora vector engine (VE), for which
// LibTorch builds no backend. Not PrivateUse1 or HPU: LibTorch 2.x counts those as accelerators,
// whose autograd streams come from the build's accelerator (CUDA, absent here). Not the lazy
// device (at::kLazy): there Keel's sharded gradient sync computed other values than on the CPU,
// and empty_like of a contiguous view of one of its tensors returns a CPU tensor.
#ifndef KEEL_TESTING_FAKE_GPU_H_
#define KEEL_TESTING_FAKE_GPU_H_

#include "c10/core/Device.h"

namespace keel::testing {

// How many fake GPUs there are: ranks on threads take one each (autograd runs each device's
// backward passes on its own thread, so ranks sharing one would wait for each other).
constexpr c10::DeviceIndex kFakeGpus = 8;

// Fake GPU `index` (of type VE). Its kernels are registered when this library is linked.
// Throws c10::Error for an index outside [0, kFakeGpus).
at::Device FakeGpu(c10::DeviceIndex index = 0);

}  // namespace keel::testing

#endif  // KEEL_TESTING_FAKE_GPU_H_
