#include "gradients/tail_padding.h"

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"

namespace keel::gradients {

absl::StatusOr<int64_t> CountTailPadding(const at::Tensor& labels, int64_t ignore_label) {
  if (!labels.defined() || labels.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "labels must be a 2-D [batch, seq] tensor, got ",
        labels.defined() ? absl::StrCat(labels.dim(), "-D") : std::string("an undefined tensor")));
  }
  if (!at::isIntegralType(labels.scalar_type(), /*includeBool=*/false)) {
    return absl::InvalidArgumentError(absl::StrCat("labels must have an integer dtype, got ",
                                                   c10::toString(labels.scalar_type())));
  }
  // Reversed rows: the cumulative product of "is padding" stays 1 exactly over the tail.
  const at::Tensor tail = labels.flip({1}).eq(ignore_label).to(at::kInt).cumprod(1);
  return tail.sum().item<int64_t>();
}

}  // namespace keel::gradients
