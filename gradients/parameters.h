// A model's parameters by name, each with its layout over the device mesh: what clipping, the
// gradient syncs and the distributed optimizer take, so that they can work on part of a model
// (the dense parameters over dp, the experts over expert dp) and know each one's layout.
//
//   std::vector<keel::gradients::NamedParameter> params =
//       TrainableParameters({model.get()}, keel::parallel::ParameterLayouts(*model));
#ifndef KEEL_GRADIENTS_PARAMETERS_H_
#define KEEL_GRADIENTS_PARAMETERS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "parallel/layout.h"
#include "torch/nn/module.h"

namespace keel::gradients {

// A parameter by fully qualified name; its grad() is read and written in place.
struct NamedParameter {
  std::string name;
  at::Tensor param;
  // How the parameter and its gradient lie over the mesh; nullopt for an ordinary tensor,
  // whole and equal on every rank that holds it.
  std::optional<parallel::TensorLayout> layout = std::nullopt;
  // A copy of a parameter that another pipeline stage holds too (Megatron's `shared`: the last
  // stage's output layer tied to the first stage's word embedding): clipping scales its
  // gradient but leaves it out of the norm, which counts the parameter once, on the other
  // stage. Default: false.
  bool shared = false;
  // One of the two copies of a word embedding tied to an output layer on another pipeline stage,
  // the first stage's or the last's (Megatron's `shared_embedding`): sharded over a group
  // (ShardedGradSync), it gets a bucket of its own, so that both stages cut it into the same
  // rows per rank and the embedding group can sum their shards' gradients. Default: false.
  bool shared_embedding = false;
};

// Whether `p`'s layout has a mesh dimension named `dim_name` (an expert parameter's "ep", say);
// false without a layout or for an empty name.
bool HasLayoutDim(const NamedParameter& p, const std::string& dim_name);

// The parameters with requires_grad of each module, in order, each tensor once under its first
// name as Python's named_parameters() gives them (a tied weight is counted once), without
// layouts.
std::vector<NamedParameter> TrainableParameters(const std::vector<torch::nn::Module*>& model_parts);

// As above, each parameter with its layout in `layouts` by name, if any (a model's
// parallel::ParameterLayouts); layouts of other names are ignored.
std::vector<NamedParameter> TrainableParameters(
    const std::vector<torch::nn::Module*>& model_parts,
    const std::map<std::string, parallel::TensorLayout>& layouts);

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_PARAMETERS_H_
