// Rank 0's check that every token of a dataset is an embedding row, scanned once per dataset:
// the first scan records the range of ids it found beside the dataset's index cache
// ("<cache_dir>/<name>.token_range.json", keyed by the dataset's path and its .bin's and .idx's
// sizes and modification times), and later launches compare model.vocab_size with the record
// instead of reading every token again.
//
//   KEEL_RETURN_IF_ERROR(CheckTokenRange(dataset, prefix, vocab_size, cache_dir));
#ifndef KEEL_TOOLS_RECIPE_TOKEN_RANGE_H_
#define KEEL_TOOLS_RECIPE_TOKEN_RANGE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "sampling/indexed_dataset.h"

namespace keel::tools::recipe {

// The record's path for the dataset at `prefix` in `cache_dir`.
std::string TokenRangePath(const std::string& prefix, const std::string& cache_dir);

// OK when every token of `dataset` (opened from `prefix`) lies in [0, vocab_size): from the
// record in `cache_dir` when it matches the files, else by a scan that then writes the record
// (a record that cannot be written, in a read-only cache, only means the next launch scans
// again). Errors: kInvalidArgument naming the first token outside the range, its position in
// the .bin and model.vocab_size (found by a scan, also when the record said so).
[[nodiscard]] absl::Status CheckTokenRange(const sampling::IndexedDataset& dataset,
                                           const std::string& prefix, int64_t vocab_size,
                                           const std::string& cache_dir);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TOKEN_RANGE_H_
