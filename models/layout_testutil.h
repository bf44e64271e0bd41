// Checks that a model split over two ranks is the one-rank model: each rank holds exactly its
// slice of the one-rank weights and computes that model's losses and, slice for slice, its
// gradients (two tensor-parallel ranks), or the stages in turn compute its losses (two pipeline
// stages). For every family's tests.
#ifndef KEEL_MODELS_LAYOUT_TESTUTIL_H_
#define KEEL_MODELS_LAYOUT_TESTUTIL_H_

#include "models/model_options.h"

namespace keel::models::testing {

// Over tensor-parallel ranks the losses agree within 1e-6 (relative) and each gradient within
// 1e-5 of its largest element (the sums' order differs); over pipeline stages the losses are
// equal. With `sequence_parallel` (ModelGroups') the ranks split the sequence too: each one's
// hidden states are its half of the sequence, and the gradients of the parameters the model
// names (LanguageModel::SequenceParallelParameters, some) are summed over the ranks first, as
// the trainer sums them.
void ExpectTwoTensorParallelRanksComputeTheOneRankModel(const ModelOptions& options,
                                                        bool sequence_parallel = false);
void ExpectTwoPipelineStagesComputeTheOneRankModel(const ModelOptions& options);

}  // namespace keel::models::testing

#endif  // KEEL_MODELS_LAYOUT_TESTUTIL_H_
