#include <iostream>
#include <string>

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

// Keel runs the same ATen ops in the same order and dtypes as NeMo on torch 2.11 (a reduced-
// precision gradient times the float64 0-d clip coefficient computed in float32, the sums in
// torch's own order), so on the LibTorch and CPU kernels that recorded the golden file (the
// test's environment pins ATen and MKL to AVX2) norms and clipped gradients are bit-identical.
TEST(GradUtilsParityTest, MatchesNemoOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(GoldenFile file, LoadGoldenFile());
  ASSERT_FALSE(file.cases.empty());
  for (const auto& c : file.cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(RunGradUtilsCase(c.inputs), MatchesGolden(c.expected, /*max_ulps=*/0));
  }
  std::cout << "LibTorch " << TORCH_VERSION << ", golden file recorded under torch "
            << file.header.value(Json::json_pointer("/torch/torch.__version__"), "?") << ": "
            << file.cases.size() << " cases compared bit for bit\n";
}

}  // namespace
}  // namespace keel::gradients
