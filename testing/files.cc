#include "testing/files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace keel::testing {

std::string NewTempDir(absl::string_view name, absl::string_view root) {
  const char* test_tmpdir = std::getenv("TEST_TMPDIR");
  if (root.empty()) root = test_tmpdir != nullptr ? test_tmpdir : "/tmp";
  std::string dir = absl::StrCat(root, "/", name, "_XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << dir << " failed";
  return dir;
}

std::optional<std::string> WhyNotExecutable(const std::string& path) {
  if (::access(path.c_str(), X_OK) == 0) return std::nullopt;
  std::ifstream in(path);
  std::string why;
  if (!in || !std::getline(in, why) || why.empty()) why = absl::StrCat(path, " is not executable");
  return why;
}

std::string ReadFileOrFail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFileOrFail(const std::string& path, absl::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

void FlipBit(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "cannot open " << path;
  unsigned char byte = 0;
  const bool flipped = ::pread(fd, &byte, 1, static_cast<off_t>(offset)) == 1 &&
                       (byte ^= 0x10, ::pwrite(fd, &byte, 1, static_cast<off_t>(offset)) == 1);
  ::close(fd);
  ASSERT_TRUE(flipped) << "cannot flip the byte at " << offset << " of " << path;
}

}  // namespace keel::testing
