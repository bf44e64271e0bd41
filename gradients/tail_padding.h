// count_tail_padding from NeMo AutoModel (nemo_automodel/components/training/utils.py): the
// number of ignore_label tokens at the end of each row of a [batch, seq] label tensor, summed.
// Loss normalisation by label tokens subtracts it when sequences are right-padded.
//
//   KEEL_ASSIGN_OR_RETURN(int64_t padding, keel::gradients::CountTailPadding(labels));
#ifndef KEEL_GRADIENTS_TAIL_PADDING_H_
#define KEEL_GRADIENTS_TAIL_PADDING_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"

namespace keel::gradients {

// Per row, the length of the trailing run of `ignore_label`; the total over rows.
// Example: [[-100, 1, 1, -100, -100], [-100, -100, 2, 3, 4], [5, 6, -100, -100, -100]] -> 5.
// Errors: kInvalidArgument if `labels` is not a 2-D tensor of an integer dtype.
[[nodiscard]] absl::StatusOr<int64_t> CountTailPadding(const at::Tensor& labels,
                                                       int64_t ignore_label = -100);

}  // namespace keel::gradients

#endif  // KEEL_GRADIENTS_TAIL_PADDING_H_
