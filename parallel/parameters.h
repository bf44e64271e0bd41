// Where the parallel layers (tensor_parallel/, moe/) and the models' blocks allocate their
// parameters: filled on the CPU, or, while a MetaParameters lives on the thread, on the meta
// device: names and shapes without memory, for a whole model built only to describe itself
// (torchtitan's meta-device build), whose initialisation then runs one parameter at a time
// (tensor_parallel/layers.h's InitialiseFromWholeSteps).
//
//   { keel::parallel::MetaParameters meta; whole = BuildTheOneRankModel(); }  // no memory
#ifndef KEEL_PARALLEL_PARAMETERS_H_
#define KEEL_PARALLEL_PARAMETERS_H_

#include "ATen/core/Tensor.h"
#include "c10/util/ArrayRef.h"

namespace keel::parallel {

// A float32 tensor of `shape` filled with `value` on the CPU, or uninitialised on the meta
// device while a MetaParameters lives on this thread.
at::Tensor NewParameter(at::IntArrayRef shape, double value = 0.0);

// Parameters allocated on this thread while it lives are on the meta device. Nests.
class MetaParameters {
 public:
  MetaParameters();
  ~MetaParameters();
  MetaParameters(const MetaParameters&) = delete;
  MetaParameters& operator=(const MetaParameters&) = delete;
};

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_PARAMETERS_H_
