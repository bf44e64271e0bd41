#include "tools/cli/exit_code.h"

#include "gtest/gtest.h"

namespace keel::tools::cli {
namespace {

TEST(ExitCodeTest, UsageForBadInputFailureForTheRest) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("bad flag")), 2);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("no file")), 1);
  EXPECT_EQ(ExitCodeFor(absl::DataLossError("corrupt")), 1);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("peer gone")), 1);
}

TEST(ExitCodeTest, AComputedVerdictPassesThrough) {
  EXPECT_EQ(Exit("ckpt", absl::StatusOr<int>(1)), 1);
  EXPECT_EQ(Exit("ckpt", absl::StatusOr<int>(absl::InvalidArgumentError("usage"))), 2);
}

}  // namespace
}  // namespace keel::tools::cli
