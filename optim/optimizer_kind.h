// The LibTorch optimizers Keel knows by type, in one table: the learning-rate schedule sets
// their weight decay, the distributed optimizer steps their shards (each is elementwise), and
// checkpoint::OptimizerState saves their state by parameter name. Names are PyTorch's class
// names, as checkpoints record them.
//
//   KEEL_ASSIGN_OR_RETURN(keel::optim::OptimizerKind kind, keel::optim::KindOf(optimizer));
//   if (kind == keel::optim::OptimizerKind::kAdamW) { ... }
#ifndef KEEL_OPTIM_OPTIMIZER_KIND_H_
#define KEEL_OPTIM_OPTIMIZER_KIND_H_

#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "torch/optim/optimizer.h"

namespace keel::optim {

enum class OptimizerKind { kAdam, kAdamW, kSgd, kRmsprop, kAdagrad };

// The kind of `optimizer` (torch::optim::Adam, AdamW, SGD, RMSprop or Adagrad).
// Errors: kInvalidArgument for any other type (LBFGS, a custom optimizer), listing these.
[[nodiscard]] absl::StatusOr<OptimizerKind> KindOf(const torch::optim::Optimizer& optimizer);

// "Adam", "AdamW", "SGD", "RMSprop" or "Adagrad".
absl::string_view OptimizerKindName(OptimizerKind kind);

// OK when `optimizer`, a factory's product, exists, is of the table's kinds, and its param
// groups hold each of `tensors` exactly once and nothing else. `noun` names a tensor in errors
// ("shard", "parameter"). Errors: kInvalidArgument naming the group and position of a tensor
// that is not one of them or is listed twice, or the tensor left out.
[[nodiscard]] absl::Status CheckOptimizerHoldsEachOnce(
    const torch::optim::Optimizer* optimizer,
    const std::vector<std::pair<std::string, at::Tensor>>& tensors, absl::string_view noun);

// Sets the weight decay of param-group options of `kind`'s type.
// Requires: `options` are `kind`'s options type.
void SetWeightDecay(OptimizerKind kind, torch::optim::OptimizerOptions& options,
                    double weight_decay);

}  // namespace keel::optim

#endif  // KEEL_OPTIM_OPTIMIZER_KIND_H_
