#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::base {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::NewTempDir;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

TEST(ErrnoCodeTest, FollowsTheDocumentedTable) {
  const std::vector<std::pair<int, absl::StatusCode>> table = {
      {ENOENT, absl::StatusCode::kNotFound},
      {EEXIST, absl::StatusCode::kAlreadyExists},
      {ENOTEMPTY, absl::StatusCode::kAlreadyExists},
      {ENOSPC, absl::StatusCode::kResourceExhausted},
      {EDQUOT, absl::StatusCode::kResourceExhausted},
      {EFBIG, absl::StatusCode::kResourceExhausted},
      {EMFILE, absl::StatusCode::kResourceExhausted},
      {EACCES, absl::StatusCode::kPermissionDenied},
      {EROFS, absl::StatusCode::kPermissionDenied},
      {ENOTDIR, absl::StatusCode::kInvalidArgument},
      {EISDIR, absl::StatusCode::kInvalidArgument},
      {EIO, absl::StatusCode::kDataLoss},
      {EAGAIN, absl::StatusCode::kUnavailable},
      {ECONNREFUSED, absl::StatusCode::kUnavailable},
      {EXDEV, absl::StatusCode::kInternal},
  };
  for (const auto& [error, code] : table) {
    SCOPED_TRACE(error);
    EXPECT_EQ(ErrnoCode(error), code);
  }
}

TEST(ErrnoStatusTest, NamesTheOperationThePathAndTheReason) {
  EXPECT_THAT(ErrnoStatus(ENOSPC, "writing", "/data/x"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("writing /data/x: No space left on device")));
}

TEST(FilesTest, WriteReadAndAtomicReplace) {
  const std::string dir = NewTempDir("files");
  const std::string path = JoinPath(dir, "a.txt");
  ASSERT_THAT(WriteFile(path, "first"), IsOk());
  KEEL_ASSERT_OK_AND_ASSIGN(std::string read, ReadFile(path));
  EXPECT_EQ(read, "first");
  ASSERT_THAT(WriteFileAtomically(path, std::string(100000, 'x')), IsOk());
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadFile(path));
  EXPECT_EQ(read, std::string(100000, 'x'));
  EXPECT_FALSE(PathExists(path + ".tmp"));
}

TEST(FilesTest, MissingFilesAreNotFoundNamingThePath) {
  const std::string path = JoinPath(NewTempDir("missing"), "nothing");
  EXPECT_THAT(ReadFile(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(ListDirectory(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(RemoveTree(path), IsOk());
}

TEST(FilesTest, MakeDirectoriesRemoveTreeAndList) {
  const std::string dir = NewTempDir("tree");
  const std::string deep = JoinPath(dir, "a/b/c");
  ASSERT_THAT(MakeDirectories(deep), IsOk());
  ASSERT_THAT(MakeDirectories(deep), IsOk());  // existing: fine
  EXPECT_TRUE(IsDirectory(deep));
  ASSERT_THAT(WriteFile(JoinPath(deep, "f"), "x"), IsOk());
  ASSERT_THAT(WriteFile(JoinPath(dir, "a/g"), "y"), IsOk());
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, ListDirectory(JoinPath(dir, "a")));
  EXPECT_THAT(names, UnorderedElementsAre("b", "g"));
  ASSERT_THAT(RemoveTree(JoinPath(dir, "a")), IsOk());
  EXPECT_FALSE(PathExists(JoinPath(dir, "a")));
}

TEST(FilesTest, MakeDirectoryNeedsItsParent) {
  const std::string dir = NewTempDir("one_level");
  ASSERT_THAT(MakeDirectory(JoinPath(dir, "a")), IsOk());
  ASSERT_THAT(MakeDirectory(JoinPath(dir, "a")), IsOk());  // existing: fine
  EXPECT_THAT(MakeDirectory(JoinPath(dir, "x/y")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(JoinPath(dir, "x/y"))));
}

TEST(FilesTest, MakeDirectoriesUnderAFileIsAnError) {
  const std::string dir = NewTempDir("under_file");
  ASSERT_THAT(WriteFile(JoinPath(dir, "f"), "x"), IsOk());
  EXPECT_THAT(
      MakeDirectories(JoinPath(dir, "f/sub")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(JoinPath(dir, "f: Not a directory"))));
}

TEST(FilesTest, PreadAllReportsTruncationAsDataLoss) {
  const std::string path = JoinPath(NewTempDir("pread"), "short");
  ASSERT_THAT(WriteFile(path, "0123456789"), IsOk());
  KEEL_ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(path, O_RDONLY));
  char buffer[8];
  ASSERT_THAT(PreadAll(fd.get(), path, buffer, 4, 6), IsOk());
  EXPECT_EQ(std::string(buffer, 4), "6789");
  EXPECT_THAT(PreadAll(fd.get(), path, buffer, 8, 6),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
}

TEST(UniqueFdTest, ClosesOnDestructionAndMove) {
  const std::string path = JoinPath(NewTempDir("fd"), "f");
  ASSERT_THAT(WriteFile(path, "x"), IsOk());
  int raw = -1;
  {
    KEEL_ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(path, O_RDONLY));
    raw = fd.get();
    UniqueFd moved = std::move(fd);
    EXPECT_FALSE(fd.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
    EXPECT_EQ(moved.get(), raw);
  }
  errno = 0;
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(PathsTest, JoinAndParent) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(ParentDirectory("a/b/c"), "a/b");
  EXPECT_EQ(ParentDirectory("c"), ".");
  EXPECT_EQ(ParentDirectory("/c"), "/");
}

}  // namespace
}  // namespace keel::base
