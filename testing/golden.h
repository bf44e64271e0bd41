// Golden reference cases (testdata/golden/*.json, produced by the Python references) and the
// matcher that applies their comparison rules.
//
//   KEEL_ASSERT_OK_AND_ASSIGN(auto cases, keel::testing::LoadGoldenCases());  // --golden
//   for (const auto& c : cases) {
//     SCOPED_TRACE(c.name);
//     EXPECT_THAT(RunParamSchedulerCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
//   }
#ifndef KEEL_TESTING_GOLDEN_H_
#define KEEL_TESTING_GOLDEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/json.h"
#include "gmock/gmock.h"

// --golden=<file>: the golden file a parity test reads (set in the test's BUILD args).
ABSL_DECLARE_FLAG(std::string, golden);

namespace keel::testing {

struct GoldenCase {
  std::string name;
  std::string feature;
  base::Json inputs;
  base::Json expected;
};

struct GoldenFile {
  // Every field but the cases: component, upstream, torch (what recorded it), conventions...
  base::Json header;
  std::vector<GoldenCase> cases;
};

// The golden file named by --golden. Errors: kInvalidArgument when the flag is unset, the
// file is malformed, or it holds no case; kNotFound when it cannot be read.
[[nodiscard]] absl::StatusOr<GoldenFile> LoadGoldenFile();
[[nodiscard]] absl::StatusOr<GoldenFile> LoadGoldenFile(const std::string& path);

// Only the cases of LoadGoldenFile.
[[nodiscard]] absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases();
[[nodiscard]] absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases(const std::string& path);

// The floating-point format whose units in the last place a comparison counts: float64's
// count the doubles between two values; a narrower format's count |expected - actual| in its
// spacing at |expected| (for values computed through that format, e.g. bfloat16 gradients).
enum class UlpsOf { kFloat64, kFloat32, kFloat16, kBFloat16 };

// Whether a Python reference error (its `error_type`) may be reported as `code`.
bool ErrorTypeMatchesCode(const std::string& error_type, absl::StatusCode code);

// Differences between `expected` and `actual` as one line per JSON path ("$.trace[3].lr[0]:
// expected 0.1, got 0.10000000000000002 (1 ulps)"); empty when they match. Objects must have
// the same keys, arrays the same length, strings and booleans equal values; numbers (integer
// or floating, in either file) may differ by at most `max_ulps` units in the last place of
// `unit`.
std::vector<std::string> GoldenDiff(const base::Json& expected, const base::Json& actual,
                                    int64_t max_ulps, UlpsOf unit = UlpsOf::kFloat64);

// Matches a StatusOr<Json> against a case's `expected`: an expected {"error", "error_type"}
// needs a non-OK status whose code fits error_type; anything else needs an OK value with no
// GoldenDiff.
::testing::Matcher<const absl::StatusOr<base::Json>&> MatchesGolden(const base::Json& expected,
                                                                    int64_t max_ulps,
                                                                    UlpsOf unit = UlpsOf::kFloat64);

}  // namespace keel::testing

#endif  // KEEL_TESTING_GOLDEN_H_
