#include "tools/recipe/profile.h"

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SummarizeProfileTest, RanksKernelsAndOperatorsPerStepAndShareOfTheWallTime) {
  // Two steps in 10 ms: a 2 ms kernel three times and a 1 ms copy once (7 ms busy: 3.5 ms a
  // step, 70%); an operator of 3 ms twice.
  const std::vector<ProfiledEvent> events = {
      {"gemm", true, 2'000'000},   {"aten::mm", false, 3'000'000}, {"gemm", true, 2'000'000},
      {"memcpy", true, 1'000'000}, {"aten::mm", false, 3'000'000}, {"gemm", true, 2'000'000},
  };
  const std::string summary = SummarizeProfile(events, /*wall_seconds=*/0.01, /*steps=*/2);
  EXPECT_THAT(summary, HasSubstr("device: 3.500 ms/step busy (70.0% of the wall time), 2.0 "
                                 "kernels and copies per step"));
  // gemm: 6 ms over 2 steps = 3 ms a step, 60% of 10 ms, 1.5 calls a step; first.
  EXPECT_THAT(summary, HasSubstr("    3.000   60.0%         1.5  gemm\n"
                                 "    0.500   10.0%         0.5  memcpy\n"));
  EXPECT_THAT(summary, HasSubstr("host operators (each with the operators it calls):\n"
                                 "  ms/step   share  calls/step  name\n"
                                 "    3.000   60.0%         1.0  aten::mm\n"));
}

TEST(SummarizeProfileTest, KeepsTheTopRowsOnly) {
  std::vector<ProfiledEvent> events;
  for (int i = 1; i <= 5; ++i) events.push_back({"op" + std::to_string(i), false, 1000u * i});
  const std::string summary = SummarizeProfile(events, 1.0, 1, /*top=*/2);
  EXPECT_THAT(summary, HasSubstr("op5"));
  EXPECT_THAT(summary, HasSubstr("op4"));
  EXPECT_THAT(summary, Not(HasSubstr("op3")));
  EXPECT_THAT(summary, Not(HasSubstr("device:")));  // no device events: no device section
}

TEST(StepProfilerTest, ProfilesTheConfiguredStepsOnTheCpu) {
  const std::string dir = keel::testing::NewTempDir("profile");
  LoggingOptions options;
  options.profile_steps = 2;
  options.profile_after_step = 1;
  StepProfiler profiler(options, dir, at::kCPU);
  std::ostringstream log;
  // What the profiler prints to stderr: on a machine without a GPU driver Kineto once printed
  // "gpuGetDeviceCount failed" as an error here, on a CPU run that needs no GPU.
  struct CapturedStderr {
    std::ostringstream text;
    std::streambuf* const saved = std::cerr.rdbuf(text.rdbuf());
    ~CapturedStderr() { std::cerr.rdbuf(saved); }
  } err;
  const at::Tensor a = at::randn({64, 64});
  for (int64_t step = 1; step <= 4; ++step) {
    KEEL_ASSERT_OK(profiler.BeforeStep(step));
    if (step == 1 || step == 4) {
      (void)a.sum();  // outside the window
    } else {
      (void)at::mm(a, a);
    }
    KEEL_ASSERT_OK(profiler.AfterStep(step, log));
    if (step < 3) {
      EXPECT_EQ(log.str(), "");
    }
  }
  EXPECT_THAT(err.text.str(), Not(HasSubstr("gpuGetDeviceCount")));
  EXPECT_THAT(log.str(), HasSubstr("profile of steps 2-3 (2 steps, "));
  EXPECT_THAT(log.str(), HasSubstr("aten::mm"));
  EXPECT_THAT(log.str(), Not(HasSubstr("aten::sum")));
  EXPECT_THAT(keel::testing::ReadFileOrFail(dir + "/profile.json"), HasSubstr("aten::mm"));
}

TEST(StepProfilerTest, ProfilesNothingWithoutSteps) {
  StepProfiler profiler(LoggingOptions(), keel::testing::NewTempDir("none"), at::kCPU);
  std::ostringstream log;
  for (int64_t step = 1; step <= 8; ++step) {
    KEEL_ASSERT_OK(profiler.BeforeStep(step));
    KEEL_ASSERT_OK(profiler.AfterStep(step, log));
  }
  EXPECT_EQ(log.str(), "");
}

}  // namespace
}  // namespace keel::tools::recipe
