#include "optim/internal/main_copies.h"

#include <utility>

#include "ATen/core/grad_mode.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace keel::optim::internal {

absl::StatusOr<MainCopies> MainCopies::Create(std::vector<at::Tensor> tensors) {
  MainCopies copies;
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kInternal, "allocating the main parameters", [&] {
        for (const at::Tensor& tensor : tensors) {
          copies.main_.push_back(tensor.scalar_type() == at::kFloat
                                     ? tensor
                                     : tensor.detach().to(at::kFloat, false, /*copy=*/true));
        }
      }));
  copies.model_ = std::move(tensors);
  return copies;
}

bool MainCopies::any() const {
  for (size_t i = 0; i < main_.size(); ++i) {
    if (!main_[i].is_same(model_[i])) return true;
  }
  return false;
}

absl::Status MainCopies::ToModel() const {
  at::NoGradGuard no_grad;
  return base::CallTorch(absl::StatusCode::kInternal, "copying the main parameters", [&] {
    for (size_t i = 0; i < main_.size(); ++i) {
      if (!main_[i].is_same(model_[i])) at::Tensor(model_[i]).copy_(main_[i]);
    }
  });
}

void MainCopies::FromModel() const {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < main_.size(); ++i) {
    if (!main_[i].is_same(model_[i])) at::Tensor(main_[i]).copy_(model_[i]);
  }
}

}  // namespace keel::optim::internal
