// A module's parameters as Python's Module.named_parameters() gives them, for everything in Keel
// that walks a model's parameters (clipping, gradient buckets, checkpoints): each tensor once,
// under its first name, in registration order. LibTorch's named_parameters() lists a tensor
// registered twice (an lm_head tied to the input embedding) under every name.
//
//   const keel::base::UniqueParameters params = keel::base::UniqueNamedParameters(*model);
//   for (const auto& [name, tensor] : params.unique) { ... }
#ifndef KEEL_BASE_NAMED_PARAMETERS_H_
#define KEEL_BASE_NAMED_PARAMETERS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "torch/nn/module.h"

namespace keel::base {

struct UniqueParameters {
  // Each parameter once, under its first name.
  std::vector<std::pair<std::string, at::Tensor>> unique;
  // Every later name of a parameter, mapped to its first name ({"lm_head.weight": "wte.weight"}).
  std::map<std::string, std::string> repeats;
};

// The parameters of `module` and its submodules, recursively; a tensor is the same parameter
// when it is the same tensor (TensorImpl), as Python compares by identity.
UniqueParameters UniqueNamedParameters(const torch::nn::Module& module);

}  // namespace keel::base

#endif  // KEEL_BASE_NAMED_PARAMETERS_H_
