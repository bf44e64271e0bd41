#include "optim/optimizer_kind.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "base/enum.h"
#include "base/status.h"
#include "torch/optim/adagrad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/rmsprop.h"
#include "torch/optim/sgd.h"

namespace keel::optim {
namespace {

constexpr base::EnumSpelling<OptimizerKind> kKinds[] = {
    {OptimizerKind::kAdam, "Adam"},       {OptimizerKind::kAdamW, "AdamW"},
    {OptimizerKind::kSgd, "SGD"},         {OptimizerKind::kRmsprop, "RMSprop"},
    {OptimizerKind::kAdagrad, "Adagrad"},
};

template <typename O>
void SetWeightDecayOf(torch::optim::OptimizerOptions& options, double weight_decay) {
  static_cast<O&>(options).weight_decay(weight_decay);
}

}  // namespace

absl::StatusOr<OptimizerKind> KindOf(const torch::optim::Optimizer& optimizer) {
  const torch::optim::Optimizer* o = &optimizer;
  // AdamW before Adam, should a type ever derive from the other.
  if (dynamic_cast<const torch::optim::AdamW*>(o) != nullptr) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(o) != nullptr) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(o) != nullptr) return OptimizerKind::kSgd;
  if (dynamic_cast<const torch::optim::RMSprop*>(o) != nullptr) return OptimizerKind::kRmsprop;
  if (dynamic_cast<const torch::optim::Adagrad*>(o) != nullptr) return OptimizerKind::kAdagrad;
  std::string names;
  for (const auto& kind : kKinds) absl::StrAppend(&names, names.empty() ? "" : ", ", kind.name);
  return absl::InvalidArgumentError(
      absl::StrCat("the optimizer must be one of torch::optim::{", names,
                   "} (elementwise, and known to checkpoints); LBFGS and other types are not "
                   "supported"));
}

absl::string_view OptimizerKindName(OptimizerKind kind) { return base::EnumName(kKinds, kind); }

absl::Status CheckOptimizerHoldsEachOnce(
    const torch::optim::Optimizer* optimizer,
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, absl::string_view noun) {
  if (optimizer == nullptr) {
    return absl::InvalidArgumentError("the optimizer factory returned no optimizer");
  }
  // The table's optimizers are elementwise (LBFGS's step depends on every element), so they
  // step shards as whole parameters, and checkpoints know them.
  KEEL_RETURN_IF_ERROR(KindOf(*optimizer).status());
  std::unordered_map<const c10::TensorImpl*, int> seen;
  for (const auto& [name, tensor] : tensors) seen[tensor.unsafeGetTensorImpl()] = 0;
  const auto& groups = optimizer->param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    for (size_t j = 0; j < groups[i].params().size(); ++j) {
      auto it = seen.find(groups[i].params()[j].unsafeGetTensorImpl());
      if (it == seen.end() || ++it->second > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("the optimizer's param_groups[", i, "].params[", j, "] is ",
                         it == seen.end() ? "not a " : "a ", noun, "'s tensor",
                         it == seen.end() ? "" : " listed twice"));
      }
    }
  }
  for (const auto& [name, tensor] : tensors) {
    if (seen[tensor.unsafeGetTensorImpl()] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the optimizer does not hold the ", noun, " of '", name, "'; it would never be stepped"));
    }
  }
  return absl::OkStatus();
}

void SetWeightDecay(OptimizerKind kind, torch::optim::OptimizerOptions& options,
                    double weight_decay) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return SetWeightDecayOf<torch::optim::AdamOptions>(options, weight_decay);
    case OptimizerKind::kAdamW:
      return SetWeightDecayOf<torch::optim::AdamWOptions>(options, weight_decay);
    case OptimizerKind::kSgd:
      return SetWeightDecayOf<torch::optim::SGDOptions>(options, weight_decay);
    case OptimizerKind::kRmsprop:
      return SetWeightDecayOf<torch::optim::RMSpropOptions>(options, weight_decay);
    case OptimizerKind::kAdagrad:
      return SetWeightDecayOf<torch::optim::AdagradOptions>(options, weight_decay);
  }
}

}  // namespace keel::optim
