#include "tools/recipe/run_dir_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// flock locks belong to an open file: a second Acquire in this process conflicts as another
// process's would.
TEST(RunDirLockTest, ASecondHolderIsRefusedNamingTheDirectoryAndTheHolder) {
  const std::string run_dir = keel::testing::NewTempDir("locked") + "/run";
  std::optional<RunDirLock> first;
  {
    KEEL_ASSERT_OK_AND_ASSIGN(RunDirLock lock, RunDirLock::Acquire(run_dir));
    first.emplace(std::move(lock));
  }
  EXPECT_THAT(RunDirLock::Acquire(run_dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("run directory " + run_dir + " is in use by process " +
                                       std::to_string(::getpid())),
                             HasSubstr("choose another run_dir"))));
  first.reset();  // released
  EXPECT_THAT(RunDirLock::Acquire(run_dir).status(), IsOk());
}

// A holder killed with SIGKILL leaves no stale lock: the kernel releases it.
TEST(RunDirLockTest, AKilledHolderLeavesNoStaleLock) {
  const std::string run_dir = keel::testing::NewTempDir("killed");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    absl::StatusOr<RunDirLock> lock = RunDirLock::Acquire(run_dir);
    const char ok = lock.ok() ? 1 : 0;
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();  // holds the lock until killed
    _exit(0);
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1);
  EXPECT_THAT(RunDirLock::Acquire(run_dir), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                     HasSubstr(absl::StrCat("process ", child))));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_THAT(RunDirLock::Acquire(run_dir).status(), IsOk());
}

TEST(RunDirLockTest, AnUnusableRunDirIsAnErrorNamingIt) {
  const std::string file = keel::testing::NewTempDir("file") + "/not_a_dir";
  keel::testing::WriteFileOrFail(file, "x");
  EXPECT_THAT(RunDirLock::Acquire(file + "/run"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(file)));
}

}  // namespace
}  // namespace keel::tools::recipe
