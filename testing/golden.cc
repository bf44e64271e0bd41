#include "testing/golden.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

ABSL_FLAG(std::string, golden, "", "Path of the golden JSON file a parity test reads.");

namespace keel::testing {
namespace {

using base::Json;

constexpr size_t kMaxReportedDiffs = 20;

// Maps a double onto a monotonically ordered integer line, so ulps are a subtraction.
int64_t OrderedBits(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits < 0 ? std::numeric_limits<int64_t>::min() - bits : bits;
}

// The spacing of `unit`'s values at |value| (its smallest subnormal below its normal range).
double UnitInTheLastPlace(double value, UlpsOf unit) {
  int mantissa_bits = 52, min_exponent = -1022;
  switch (unit) {
    case UlpsOf::kFloat64:
      break;
    case UlpsOf::kFloat32:
      mantissa_bits = 23, min_exponent = -126;
      break;
    case UlpsOf::kFloat16:
      mantissa_bits = 10, min_exponent = -14;
      break;
    case UlpsOf::kBFloat16:
      mantissa_bits = 7, min_exponent = -126;
      break;
  }
  const int exponent = value == 0 ? min_exponent : std::max(std::ilogb(value), min_exponent);
  return std::ldexp(1.0, exponent - mantissa_bits);
}

const char* NameOf(UlpsOf unit) {
  switch (unit) {
    case UlpsOf::kFloat64:
      return "float64";
    case UlpsOf::kFloat32:
      return "float32";
    case UlpsOf::kFloat16:
      return "float16";
    case UlpsOf::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

int64_t UlpsBetween(double expected, double actual, UlpsOf unit) {
  if (unit == UlpsOf::kFloat64) return std::llabs(OrderedBits(expected) - OrderedBits(actual));
  return static_cast<int64_t>(
      std::ceil(std::fabs(actual - expected) / UnitInTheLastPlace(expected, unit)));
}

struct Allowed {
  int64_t max_ulps;
  UlpsOf unit;
};

void Diff(const Json& expected, const Json& actual, const Allowed& allowed, const std::string& path,
          std::vector<std::string>& out) {
  if (out.size() >= kMaxReportedDiffs) return;
  if (expected.is_number() && actual.is_number()) {
    const double e = expected.get<double>();
    const double a = actual.get<double>();
    if (e == a) return;
    const int64_t ulps = UlpsBetween(e, a, allowed.unit);
    if (ulps <= allowed.max_ulps) return;
    out.push_back(absl::StrCat(path, ": expected ", expected.dump(), ", got ", actual.dump(), " (",
                               ulps, " ulps", allowed.unit == UlpsOf::kFloat64 ? "" : " of ",
                               allowed.unit == UlpsOf::kFloat64 ? "" : NameOf(allowed.unit), ")"));
    return;
  }
  if (expected.is_object() && actual.is_object()) {
    for (const auto& [key, value] : expected.items()) {
      auto it = actual.find(key);
      if (it == actual.end()) {
        out.push_back(absl::StrCat(path, ": missing key \"", key, "\""));
      } else {
        Diff(value, *it, allowed, absl::StrCat(path, ".", key), out);
      }
    }
    for (const auto& [key, value] : actual.items()) {
      if (!expected.contains(key))
        out.push_back(absl::StrCat(path, ": unexpected key \"", key, "\""));
    }
    return;
  }
  if (expected.is_array() && actual.is_array()) {
    if (expected.size() != actual.size()) {
      out.push_back(
          absl::StrCat(path, ": expected ", expected.size(), " elements, got ", actual.size()));
    }
    for (size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
      Diff(expected[i], actual[i], allowed, absl::StrCat(path, "[", i, "]"), out);
    }
    return;
  }
  if (expected != actual) {
    out.push_back(absl::StrCat(path, ": expected ", expected.dump(), ", got ", actual.dump()));
  }
}

class GoldenMatcher : public ::testing::MatcherInterface<const absl::StatusOr<Json>&> {
 public:
  GoldenMatcher(Json expected, int64_t max_ulps, UlpsOf unit)
      : expected_(std::move(expected)), max_ulps_(max_ulps), unit_(unit) {}

  bool MatchAndExplain(const absl::StatusOr<Json>& actual,
                       ::testing::MatchResultListener* listener) const override {
    if (expected_.is_object() && expected_.contains("error")) {
      if (actual.ok()) {
        *listener << "succeeded, but the reference failed with "
                  << expected_.value("error_type", std::string("?")) << ": "
                  << expected_["error"].dump() << "; got " << actual->dump().substr(0, 400);
        return false;
      }
      const std::string error_type = expected_.value("error_type", std::string());
      *listener << "failed with " << actual.status();
      return ErrorTypeMatchesCode(error_type, actual.status().code());
    }
    if (!actual.ok()) {
      *listener << "failed with " << actual.status();
      return false;
    }
    const std::vector<std::string> diffs = GoldenDiff(expected_, *actual, max_ulps_, unit_);
    if (!diffs.empty()) *listener << "differs:\n  " << absl::StrJoin(diffs, "\n  ");
    return diffs.empty();
  }

  void DescribeTo(std::ostream* os) const override {
    *os << "matches the golden expectation within " << max_ulps_ << " ulps of " << NameOf(unit_);
  }

 private:
  Json expected_;
  int64_t max_ulps_;
  UlpsOf unit_;
};

}  // namespace

absl::StatusOr<GoldenFile> LoadGoldenFile() {
  const std::string path = absl::GetFlag(FLAGS_golden);
  if (path.empty()) return absl::InvalidArgumentError("--golden=<file> is not set");
  return LoadGoldenFile(path);
}

absl::StatusOr<GoldenFile> LoadGoldenFile(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(Json file, base::ReadJsonFile(path));
  if (!file.is_object() || !file.contains("cases") || !file["cases"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"cases\" array"));
  }
  GoldenFile golden;
  for (Json& c : file["cases"]) {
    if (!c.is_object() || !c.contains("name") || !c.contains("inputs") || !c.contains("expected")) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": case ", golden.cases.size(), " lacks name, inputs or expected"));
    }
    golden.cases.push_back(GoldenCase{c["name"].get<std::string>(),
                                      c.value("feature", std::string()), std::move(c["inputs"]),
                                      std::move(c["expected"])});
  }
  if (golden.cases.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no cases"));
  file.erase("cases");
  golden.header = std::move(file);
  return golden;
}

absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases() {
  KEEL_ASSIGN_OR_RETURN(GoldenFile file, LoadGoldenFile());
  return std::move(file.cases);
}

absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(GoldenFile file, LoadGoldenFile(path));
  return std::move(file.cases);
}

bool ErrorTypeMatchesCode(const std::string& error_type, absl::StatusCode code) {
  // Python's exception types for refused inputs. Keel reports refused inputs as
  // kInvalidArgument, also where Python only failed later in a generic way, and where the
  // reference process aborted ("Abort", e.g. an assert in C++ helpers) or never returned
  // ("NonTermination").
  static constexpr const char* kInvalidArgumentTypes[] = {
      "ValueError", "AssertionError", "TypeError", "KeyError",      "ZeroDivisionError",
      "Exception",  "IndexError",     "Abort",     "NonTermination"};
  for (const char* type : kInvalidArgumentTypes) {
    if (error_type == type) return code == absl::StatusCode::kInvalidArgument;
  }
  if (error_type == "RuntimeError") {
    return code == absl::StatusCode::kInvalidArgument ||
           code == absl::StatusCode::kFailedPrecondition;
  }
  return false;
}

std::vector<std::string> GoldenDiff(const Json& expected, const Json& actual, int64_t max_ulps,
                                    UlpsOf unit) {
  std::vector<std::string> diffs;
  Diff(expected, actual, Allowed{max_ulps, unit}, "$", diffs);
  return diffs;
}

::testing::Matcher<const absl::StatusOr<Json>&> MatchesGolden(const Json& expected,
                                                              int64_t max_ulps, UlpsOf unit) {
  return ::testing::MakeMatcher(new GoldenMatcher(expected, max_ulps, unit));
}

}  // namespace keel::testing
