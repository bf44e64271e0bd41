#include "base/named_parameters.h"

#include <unordered_map>

namespace keel::base {

UniqueParameters UniqueNamedParameters(const torch::nn::Module& module) {
  UniqueParameters out;
  std::unordered_map<const void*, std::string> first_name;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& tensor = item.value();
    auto [it, first] = first_name.emplace(tensor.unsafeGetTensorImpl(), item.key());
    if (first) {
      out.unique.emplace_back(item.key(), tensor);
    } else {
      out.repeats.emplace(item.key(), it->second);
    }
  }
  return out;
}

}  // namespace keel::base
