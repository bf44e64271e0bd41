// Runs one gpt_dataset golden case (testdata/golden/gpt_dataset.json) through Keel, for the
// parity test and //tools:parity. The inputs and the result have the golden file's shape;
// see testdata/golden/README.md.
#ifndef KEEL_SAMPLING_GPT_DATASET_CASES_H_
#define KEEL_SAMPLING_GPT_DATASET_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::sampling {

// Writes inputs.datasets as indexed datasets in a temporary directory (removed afterwards),
// builds inputs.config's splits of inputs.sizes with BuildGptDatasets, and returns
// {splits: [train, valid, test]}, each null or the dataset's record, with the samples of
// every position of each split (`idx` from 0; the golden files list a few). Errors: those
// of BuildGptDatasets (what Keel refuses), kInvalidArgument for malformed inputs.
[[nodiscard]] absl::StatusOr<base::Json> RunGptDatasetCase(const base::Json& inputs);

// `actual` with each record's samples cut to those `expected` lists, in its order, so that
// the two compare sample for sample. Other values are left as they are.
base::Json SelectGoldenSamples(const base::Json& expected, base::Json actual);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_GPT_DATASET_CASES_H_
