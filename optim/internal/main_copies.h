// Megatron's main parameters, for the data-parallel and distributed optimizers: a float32 copy
// of each narrower (bf16, fp16) tensor, beside the tensor it copies; a float32 tensor is its own
// main copy. The optimizer steps the copies, whose values are then rounded into the tensors.
#ifndef KEEL_OPTIM_INTERNAL_MAIN_COPIES_H_
#define KEEL_OPTIM_INTERNAL_MAIN_COPIES_H_

#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"

namespace keel::optim::internal {

class MainCopies {
 public:
  // The copies of `tensors` (parameters, or views of their rows).
  // Errors: kInternal when a copy cannot be allocated.
  [[nodiscard]] static absl::StatusOr<MainCopies> Create(std::vector<at::Tensor> tensors);

  // One per tensor, in order.
  const std::vector<at::Tensor>& main() const { return main_; }
  // Whether some tensor has a copy of its own (is narrower than float32).
  bool any() const;
  // The copies' values, rounded, into the tensors. Errors: kInternal when a copy fails.
  [[nodiscard]] absl::Status ToModel() const;
  // The tensors' values into their copies.
  void FromModel() const;

 private:
  std::vector<at::Tensor> model_;
  std::vector<at::Tensor> main_;
};

}  // namespace keel::optim::internal

#endif  // KEEL_OPTIM_INTERNAL_MAIN_COPIES_H_
