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

void Diff(const Json& expected, const Json& actual, int64_t max_ulps, const std::string& path,
          std::vector<std::string>& out) {
  if (out.size() >= kMaxReportedDiffs) return;
  if (expected.is_number() && actual.is_number()) {
    const double e = expected.get<double>();
    const double a = actual.get<double>();
    if (e == a) return;
    const int64_t ulps = std::llabs(OrderedBits(e) - OrderedBits(a));
    if (ulps <= max_ulps) return;
    out.push_back(absl::StrCat(path, ": expected ", expected.dump(), ", got ", actual.dump(), " (",
                               ulps, " ulps)"));
    return;
  }
  if (expected.is_object() && actual.is_object()) {
    for (const auto& [key, value] : expected.items()) {
      auto it = actual.find(key);
      if (it == actual.end()) {
        out.push_back(absl::StrCat(path, ": missing key \"", key, "\""));
      } else {
        Diff(value, *it, max_ulps, absl::StrCat(path, ".", key), out);
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
      Diff(expected[i], actual[i], max_ulps, absl::StrCat(path, "[", i, "]"), out);
    }
    return;
  }
  if (expected != actual) {
    out.push_back(absl::StrCat(path, ": expected ", expected.dump(), ", got ", actual.dump()));
  }
}

class GoldenMatcher : public ::testing::MatcherInterface<const absl::StatusOr<Json>&> {
 public:
  GoldenMatcher(Json expected, int64_t max_ulps)
      : expected_(std::move(expected)), max_ulps_(max_ulps) {}

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
    const std::vector<std::string> diffs = GoldenDiff(expected_, *actual, max_ulps_);
    if (!diffs.empty()) *listener << "differs:\n  " << absl::StrJoin(diffs, "\n  ");
    return diffs.empty();
  }

  void DescribeTo(std::ostream* os) const override {
    *os << "matches the golden expectation within " << max_ulps_ << " ulps";
  }

 private:
  Json expected_;
  int64_t max_ulps_;
};

}  // namespace

absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases() {
  const std::string path = absl::GetFlag(FLAGS_golden);
  if (path.empty()) return absl::InvalidArgumentError("--golden=<file> is not set");
  return LoadGoldenCases(path);
}

absl::StatusOr<std::vector<GoldenCase>> LoadGoldenCases(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(Json file, base::ReadJsonFile(path));
  if (!file.is_object() || !file.contains("cases") || !file["cases"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no \"cases\" array"));
  }
  std::vector<GoldenCase> cases;
  for (Json& c : file["cases"]) {
    if (!c.is_object() || !c.contains("name") || !c.contains("inputs") || !c.contains("expected")) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": case ", cases.size(), " lacks name, inputs or expected"));
    }
    cases.push_back(GoldenCase{c["name"].get<std::string>(), c.value("feature", std::string()),
                               std::move(c["inputs"]), std::move(c["expected"])});
  }
  if (cases.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no cases"));
  return cases;
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

std::vector<std::string> GoldenDiff(const Json& expected, const Json& actual, int64_t max_ulps) {
  std::vector<std::string> diffs;
  Diff(expected, actual, max_ulps, "$", diffs);
  return diffs;
}

::testing::Matcher<const absl::StatusOr<Json>&> MatchesGolden(const Json& expected,
                                                              int64_t max_ulps) {
  return ::testing::MakeMatcher(new GoldenMatcher(expected, max_ulps));
}

}  // namespace keel::testing
