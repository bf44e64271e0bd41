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

// The safetensors spelling of `dtype`: BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16,
// F32, F64, C64 (ComplexFloat) or a float8 (F8_E5M2, F8_E4M3 for Float8_e4m3fn, and their FNUZ
// forms). Errors: kInvalidArgument for any other dtype, listing the supported ones.
[[nodiscard]] absl::StatusOr<std::string> DtypeName(at::ScalarType dtype);

// The inverse of DtypeName. Errors: kInvalidArgument for an unknown spelling or one that
// LibTorch cannot hold (F8_E8M0, F6_*, F4), listing the supported ones.
[[nodiscard]] absl::StatusOr<at::ScalarType> ParseDtype(absl::string_view name);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_DTYPE_H_
