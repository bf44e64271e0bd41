// Runs one samplers golden case (testdata/golden/samplers.json) through Keel, for the parity
// test and //tools:parity. The inputs and the result have the golden file's shape; see
// testdata/golden/README.md.
#ifndef KEEL_SAMPLING_SAMPLERS_CASES_H_
#define KEEL_SAMPLING_SAMPLERS_CASES_H_

#include "absl/status/statusor.h"
#include "base/json.h"

namespace keel::sampling {

// Builds the sampler that inputs.kind names ("MegatronPretrainingSampler",
// "MegatronPretrainingRandomSampler" or "create_megatron_sampler") for every recorded rank
// and returns {per_rank: [...]}: for a sequential sampler {data_parallel_rank, sampler_class,
// len, batches} (one full pass); for a random one, after setting consumed_samples and running
// inputs.passes, {data_parallel_rank, sampler_class, len_after, passes: [{len_before,
// consumed_samples_before, batches, epoch, consumed_samples_after}]}. Errors:
// kInvalidArgument when Keel refuses the inputs or they are malformed.
[[nodiscard]] absl::StatusOr<base::Json> RunSamplersCase(const base::Json& inputs);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_SAMPLERS_CASES_H_
