// The test file helpers that decide something: whether a program a repository rule provided can
// run, or what it says instead.
#include "testing/files.h"

#include <sys/stat.h>

#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::testing {
namespace {

using ::testing::Optional;

TEST(WhyNotExecutableTest, AProgramRunsATextFileSaysWhyNot) {
  const std::string dir = NewTempDir("programs");
  WriteFileOrFail(dir + "/torchrun", "#!/bin/sh\nexit 0\n");
  ASSERT_EQ(::chmod((dir + "/torchrun").c_str(), 0755), 0);
  EXPECT_EQ(WhyNotExecutable(dir + "/torchrun"), std::nullopt);

  // What a repository rule writes in place of a program that is not installed.
  WriteFileOrFail(dir + "/spm_train",
                  "spm_train is unavailable: /usr/bin/spm_train is not installed\nmore\n");
  EXPECT_THAT(
      WhyNotExecutable(dir + "/spm_train"),
      Optional(std::string("spm_train is unavailable: /usr/bin/spm_train is not installed")));
  EXPECT_THAT(WhyNotExecutable(dir + "/absent"), Optional(dir + "/absent is not executable"));
}

}  // namespace
}  // namespace keel::testing
