// The dtype spellings of safetensors (huggingface/safetensors, safetensors/src/tensor.rs `Dtype`),
// which the checkpoint manifest uses too, and their LibTorch scalar types. One table serves
// both directions.
//
//   KEEL_ASSIGN_OR_RETURN(std::string name, DtypeName(tensor.scalar_type()));  // "F32"
//   KEEL_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseDtype(name));             // at::kFloat
#ifndef KEEL_CHECKPOINT_INTERNAL_DTYPE_H_
#define KEEL_CHECKPOINT_INTERNAL_DTYPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "c10/core/ScalarType.h"

namespace keel::checkpoint::internal {

// The safetensors spelling of `dtype`: BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 or C64
// (ComplexFloat). Errors: kInvalidArgument for any other dtype, listing the supported ones.
[[nodiscard]] absl::StatusOr<std::string> DtypeName(at::ScalarType dtype);

// The inverse of DtypeName. Errors: kInvalidArgument for an unknown spelling or one that
// LibTorch 1.13 cannot hold (U16, U32, U64, F8_*, F6_*, F4), listing the supported ones.
[[nodiscard]] absl::StatusOr<at::ScalarType> ParseDtype(absl::string_view name);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_DTYPE_H_
