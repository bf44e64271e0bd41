#include "checkpoint/internal/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace keel::checkpoint::internal {
namespace {

struct Spelling {
  at::ScalarType dtype;
  absl::string_view name;
};

// Every dtype that safetensors and LibTorch 2.6 share (the float8 formats as safetensors'
// Python side maps them: E4M3 is torch's float8_e4m3fn).
constexpr Spelling kSpellings[] = {
    {at::kBool, "BOOL"},
    {at::kByte, "U8"},
    {at::kChar, "I8"},
    {at::kShort, "I16"},
    {at::kUInt16, "U16"},
    {at::kInt, "I32"},
    {at::kUInt32, "U32"},
    {at::kLong, "I64"},
    {at::kUInt64, "U64"},
    {at::kHalf, "F16"},
    {at::kBFloat16, "BF16"},
    {at::kFloat, "F32"},
    {at::kDouble, "F64"},
    {at::kComplexFloat, "C64"},
    {at::kFloat8_e5m2, "F8_E5M2"},
    {at::kFloat8_e4m3fn, "F8_E4M3"},
    {at::kFloat8_e5m2fnuz, "F8_E5M2FNUZ"},
    {at::kFloat8_e4m3fnuz, "F8_E4M3FNUZ"},
};

// safetensors spellings with no LibTorch 2.6 dtype (tensor.rs, `Dtype`).
constexpr absl::string_view kWithoutTorchDtype[] = {"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"};

std::string Supported() {
  std::string out;
  for (const Spelling& s : kSpellings) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", s.name, " (", c10::toString(s.dtype), ")");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> DtypeName(at::ScalarType dtype) {
  for (const Spelling& s : kSpellings) {
    if (s.dtype == dtype) return std::string(s.name);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype ", c10::toString(dtype), " has no safetensors spelling; supported: ", Supported()));
}

absl::StatusOr<at::ScalarType> ParseDtype(absl::string_view name) {
  for (const Spelling& s : kSpellings) {
    if (s.name == name) return s.dtype;
  }
  for (absl::string_view other : kWithoutTorchDtype) {
    if (other == name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype \"", name, "\" has no LibTorch equivalent; supported: ", Supported()));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", absl::CEscape(name), "\"; supported: ", Supported()));
}

}  // namespace keel::checkpoint::internal
