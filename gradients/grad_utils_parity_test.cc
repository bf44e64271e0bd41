#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "gmock/gmock.h"
#include "gradients/grad_utils_cases.h"
#include "gtest/gtest.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"
#include "torch/version.h"

namespace keel::gradients {
namespace {

using ::keel::base::Json;
using ::keel::testing::GoldenFile;
using ::keel::testing::LoadGoldenFile;
using ::keel::testing::MatchesGolden;
using ::keel::testing::UlpsOf;

// Whether the golden file was recorded under this LibTorch's major.minor version (its header's
// torch.__version__, "1.13.0a0" for Debian's 1.13.1).
bool RecordedUnderThisLibTorch(const Json& header) {
  const std::string recorded = header.value(Json::json_pointer("/torch/torch.__version__"), "");
  return absl::StartsWith(recorded,
                          absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, "."));
}

// The narrowest dtype among the case's parameters that have a gradient: the precision its
// norm and clipped gradients are computed through (NeMo runs abs, div, square and pow in the
// gradient's dtype before summing in float64).
UlpsOf GradientPrecision(const Json& inputs) {
  std::vector<Json> parameters;
  for (const Json& part : inputs.value("model_parts", Json::array())) {
    for (const Json& p : part) parameters.push_back(p);
  }
  for (const Json& p : inputs.value("parameters", Json::array())) parameters.push_back(p);
  UlpsOf narrowest = UlpsOf::kFloat64;
  for (const Json& p : parameters) {
    if (p.value("grad", Json()).is_null()) continue;
    const std::string dtype = p.value("dtype", "float32");
    if (dtype == "bfloat16") return UlpsOf::kBFloat16;
    if (dtype == "float16") narrowest = UlpsOf::kFloat16;
    if (dtype == "float32" && narrowest == UlpsOf::kFloat64) narrowest = UlpsOf::kFloat32;
  }
  return narrowest;
}

// Keel runs the same ATen ops in the same order and dtypes as NeMo, so on the LibTorch build
// and CPU kernels (AVX2) that recorded the golden file, norms and clipped gradients must be
// bit-identical. Another LibTorch's kernels round some reductions and reduced-precision
// operations differently: there a case must still be exact or, if not, within 4 ulps of the
// precision its gradients are computed through, and the test reports how many need that.
TEST(GradUtilsParityTest, MatchesNemoOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(GoldenFile file, LoadGoldenFile());
  ASSERT_FALSE(file.cases.empty());
  const bool exact = RecordedUnderThisLibTorch(file.header);
  std::vector<std::string> tolerated;
  for (const auto& c : file.cases) {
    SCOPED_TRACE(c.name);
    const absl::StatusOr<Json> actual = RunGradUtilsCase(c.inputs);
    if (exact || ::testing::Value(actual, MatchesGolden(c.expected, /*max_ulps=*/0))) {
      EXPECT_THAT(actual, MatchesGolden(c.expected, /*max_ulps=*/0));
      continue;
    }
    tolerated.push_back(c.name);
    EXPECT_THAT(actual, MatchesGolden(c.expected, /*max_ulps=*/4, GradientPrecision(c.inputs)));
  }
  ::testing::Test::RecordProperty("cases_within_4_ulps", static_cast<int>(tolerated.size()));
  std::cout << "LibTorch " << TORCH_VERSION << ", golden file recorded under torch "
            << file.header.value(Json::json_pointer("/torch/torch.__version__"), "?") << ": "
            << file.cases.size() - tolerated.size() << " of " << file.cases.size()
            << " cases exact, " << tolerated.size() << " within 4 ulps"
            << (tolerated.empty() ? "" : absl::StrCat(" (", absl::StrJoin(tolerated, ", "), ")"))
            << "\n";
}

}  // namespace
}  // namespace keel::gradients
