#include "checkpoint/internal/dtype.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint::internal {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The spellings of safetensors/src/tensor.rs `Dtype` that LibTorch holds, with the dtypes
// safetensors' torch loader maps them to (safetensors/torch.py, _TYPES).
const std::vector<std::pair<at::ScalarType, std::string>>& Expected() {
  static const auto* const kExpected = new std::vector<std::pair<at::ScalarType, std::string>>{
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
  return *kExpected;
}

TEST(DtypeTest, RoundTripsEverySupportedDtype) {
  for (const auto& [dtype, name] : Expected()) {
    SCOPED_TRACE(name);
    KEEL_ASSERT_OK_AND_ASSIGN(std::string spelled, DtypeName(dtype));
    EXPECT_EQ(spelled, name);
    KEEL_ASSERT_OK_AND_ASSIGN(at::ScalarType parsed, ParseDtype(name));
    EXPECT_EQ(parsed, dtype);
  }
}

TEST(DtypeTest, RejectsDtypesWithoutSpelling) {
  for (at::ScalarType dtype : {at::kComplexDouble, at::kComplexHalf, at::kQInt8, at::kQUInt8,
                               at::kQInt32, at::ScalarType::Undefined}) {
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_THAT(DtypeName(dtype),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("dtype ", c10::toString(dtype),
                                                      " has no safetensors spelling")),
                               HasSubstr("supported: BOOL (Bool), U8 (Byte)"),
                               HasSubstr("C64 (ComplexFloat)"))));
  }
}

TEST(DtypeTest, RejectsSafetensorsSpellingsLibTorchCannotHold) {
  for (const char* name : {"F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(
        ParseDtype(name),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(absl::StrCat("dtype \"", name, "\" has no LibTorch equivalent")),
                       HasSubstr("supported: BOOL (Bool)"))));
  }
}

TEST(DtypeTest, RejectsUnknownSpellings) {
  for (const char* name : {"", "f32", "F32 ", "float32", "C128", "I128"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(ParseDtype(name),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(absl::StrCat("unknown dtype \"", name, "\"")),
                               HasSubstr("supported: BOOL (Bool)"))));
  }
  EXPECT_THAT(ParseDtype(absl::string_view("F3\0", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype \"F3\\000\"")));
}

}  // namespace
}  // namespace keel::checkpoint::internal
