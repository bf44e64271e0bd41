// Where one training sample lands in a batch being filled: the data sources that write samples
// row by row (megatron_data.h, sft_data.h) share it with the batch (data.h).
#ifndef KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_
#define KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_

#include <cstdint>

namespace keel::tools::recipe {

// sequence_length tokens, labels and loss-mask values.
struct SampleRow {
  int64_t* tokens = nullptr;
  int64_t* labels = nullptr;
  float* loss_mask = nullptr;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_
