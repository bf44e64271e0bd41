#include "models/model_options.h"

namespace keel::models {

int64_t PaddedVocabSize(const ModelOptions& options, int64_t tp_size) {
  const int64_t multiple = options.make_vocab_size_divisible_by * tp_size;
  return (options.vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace keel::models
