#include "testing/golden.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::testing {
namespace {

using ::keel::base::Json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(GoldenDiffTest, IntegerAndFloatOfSameValueMatch) {
  EXPECT_THAT(GoldenDiff(Json::parse(R"({"lr": [0]})"), Json::parse(R"({"lr": [0.0]})"), 0),
              IsEmpty());
}

TEST(GoldenDiffTest, ReportsEveryPathThatDiffers) {
  const Json expected = Json::parse(R"({"a": [1.0, 2.0], "b": "x", "c": true})");
  const Json actual = Json::parse(R"({"a": [1.0, 2.5], "b": "y", "d": true})");
  EXPECT_THAT(GoldenDiff(expected, actual, 0),
              ElementsAre(HasSubstr("$.a[1]: expected 2.0, got 2.5"),
                          HasSubstr("$.b: expected \"x\", got \"y\""),
                          HasSubstr("$: missing key \"c\""), HasSubstr("$: unexpected key \"d\"")));
}

TEST(GoldenDiffTest, UlpBoundIsInclusive) {
  // 0.1 and 0.10000000000000002 are adjacent doubles: exactly 1 ulp apart.
  const Json expected = Json::parse("[0.1]");
  const Json actual = Json::parse("[0.10000000000000002]");
  EXPECT_THAT(GoldenDiff(expected, actual, 0), ElementsAre(HasSubstr("(1 ulps)")));
  EXPECT_THAT(GoldenDiff(expected, actual, 1), IsEmpty());
}

// Ulps of a narrower format count its spacing at the expected value: bfloat16 has 7 mantissa
// bits, so its values in [1, 2) are 2^-7 apart and in [0.5, 1) 2^-8; float16's in [1, 2) 2^-10,
// float32's 2^-23.
TEST(GoldenDiffTest, UlpsOfANarrowerFormatAreItsSpacingAtTheExpectedValue) {
  // 1.0234375 - 1 = 3 * 2^-7: 3 ulps of bfloat16 in [1, 2).
  EXPECT_THAT(GoldenDiff(Json::parse("[1.0]"), Json::parse("[1.0234375]"), 3, UlpsOf::kBFloat16),
              IsEmpty());
  EXPECT_THAT(GoldenDiff(Json::parse("[1.0]"), Json::parse("[1.0234375]"), 2, UlpsOf::kBFloat16),
              ElementsAre(HasSubstr("expected 1.0, got 1.0234375 (3 ulps of bfloat16)")));
  // 0.765625 - 0.75 = 4 * 2^-8: 4 ulps of bfloat16 in [0.5, 1).
  EXPECT_THAT(GoldenDiff(Json::parse("[0.75]"), Json::parse("[0.765625]"), 3, UlpsOf::kBFloat16),
              ElementsAre(HasSubstr("(4 ulps of bfloat16)")));
  // 2^-9 = 2 ulps of float16 in [1, 2); 2^-22 = 2 ulps of float32.
  EXPECT_THAT(GoldenDiff(Json::parse("[1.0]"), Json::parse("[1.001953125]"), 1, UlpsOf::kFloat16),
              ElementsAre(HasSubstr("(2 ulps of float16)")));
  EXPECT_THAT(
      GoldenDiff(Json::parse("[1.0]"), Json::parse("[1.0000002384185791]"), 2, UlpsOf::kFloat32),
      IsEmpty());
}

TEST(GoldenDiffTest, ArrayLengthMismatchIsReported) {
  EXPECT_THAT(GoldenDiff(Json::parse("[1, 2]"), Json::parse("[1]"), 0),
              ElementsAre(HasSubstr("expected 2 elements, got 1")));
}

TEST(MatchesGoldenTest, ExpectedErrorNeedsAMatchingStatusCode) {
  const Json expected = Json::parse(R"({"error": "bad", "error_type": "AssertionError"})");
  EXPECT_THAT(absl::StatusOr<Json>(absl::InvalidArgumentError("x")), MatchesGolden(expected, 0));
  EXPECT_THAT(absl::StatusOr<Json>(absl::InternalError("x")), Not(MatchesGolden(expected, 0)));
  EXPECT_THAT(absl::StatusOr<Json>(Json::object()), Not(MatchesGolden(expected, 0)));
}

// The exception types the golden files' reference errors carry (mesh.json's Megatron errors
// among them) are refused inputs: kInvalidArgument, and for RuntimeError also
// kFailedPrecondition.
TEST(ErrorTypeMatchesCodeTest, ReferenceErrorTypesAreRefusedInputs) {
  for (const char* type :
       {"RuntimeError", "ZeroDivisionError", "KeyError", "ValueError", "AssertionError"}) {
    SCOPED_TRACE(type);
    EXPECT_TRUE(ErrorTypeMatchesCode(type, absl::StatusCode::kInvalidArgument));
    EXPECT_FALSE(ErrorTypeMatchesCode(type, absl::StatusCode::kInternal));
    EXPECT_FALSE(ErrorTypeMatchesCode(type, absl::StatusCode::kOk));
  }
  EXPECT_TRUE(ErrorTypeMatchesCode("RuntimeError", absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(ErrorTypeMatchesCode("ValueError", absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(ErrorTypeMatchesCode("SomeOtherError", absl::StatusCode::kInvalidArgument));
}

TEST(MatchesGoldenTest, ExpectedValueNeedsOkAndNoDiff) {
  const Json expected = Json::parse(R"({"value": 1.5})");
  EXPECT_THAT(absl::StatusOr<Json>(Json::parse(R"({"value": 1.5})")), MatchesGolden(expected, 0));
  EXPECT_THAT(absl::StatusOr<Json>(absl::InvalidArgumentError("x")),
              Not(MatchesGolden(expected, 0)));
}

TEST(LoadGoldenCasesTest, MissingFlagOrFileIsAnError) {
  EXPECT_THAT(LoadGoldenCases(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--golden")));
  EXPECT_THAT(LoadGoldenCases("/nonexistent.json"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent.json")));
}

}  // namespace
}  // namespace keel::testing
