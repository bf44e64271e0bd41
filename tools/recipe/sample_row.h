// Where one training sample lands in a batch being filled: the data sources that write samples
// row by row (megatron_data.h, sft_data.h) share it with the batch (data.h).
#ifndef KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_
#define KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_

#include <cstdint>
#include <vector>

namespace keel::tools::recipe {

// A sample's tokens, labels and loss-mask values, and where it packs several sequences one
// after another, their lengths.
struct SampleRow {
  int64_t* tokens = nullptr;
  int64_t* labels = nullptr;
  float* loss_mask = nullptr;
  // Cleared, then the lengths of the packed sequences (the rest of the row padding); nullptr
  // where the source packs nothing.
  std::vector<int64_t>* sequence_lengths = nullptr;
};

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_SAMPLE_ROW_H_
