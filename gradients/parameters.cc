#include "gradients/parameters.h"

#include <unordered_set>

#include "base/named_parameters.h"

namespace keel::gradients {

bool HasLayoutDim(const NamedParameter& p, const std::string& dim_name) {
  if (dim_name.empty() || !p.layout) return false;
  for (const parallel::LayoutDim& dim : p.layout->dims) {
    if (dim.name == dim_name) return true;
  }
  return false;
}

std::vector<NamedParameter> TrainableParameters(
    const std::vector<torch::nn::Module*>& model_parts) {
  std::vector<NamedParameter> parameters;
  std::unordered_set<const void*> seen;  // a tensor shared by two parts counts once too
  for (torch::nn::Module* part : model_parts) {
    const base::UniqueParameters unique = base::UniqueNamedParameters(*part);
    for (const auto& [name, param] : unique.unique) {
      if (!seen.insert(param.unsafeGetTensorImpl()).second) continue;
      if (param.requires_grad()) parameters.push_back({name, param});
    }
  }
  return parameters;
}

std::vector<NamedParameter> TrainableParameters(
    const std::vector<torch::nn::Module*>& model_parts,
    const std::map<std::string, parallel::TensorLayout>& layouts) {
  std::vector<NamedParameter> parameters = TrainableParameters(model_parts);
  for (NamedParameter& p : parameters) {
    if (auto it = layouts.find(p.name); it != layouts.end()) p.layout = it->second;
  }
  return parameters;
}

}  // namespace keel::gradients
