// Files for tests: fresh temporary directories, whole-file reads, and real corruption (one
// flipped bit on disk) for the tests that prove corruption is caught.
//
//   const std::string dir = keel::testing::NewTempDir("resume");
//   keel::testing::FlipBit(dir + "/step_0000000003/__0.keel", /*offset=*/4096);
#ifndef KEEL_TESTING_FILES_H_
#define KEEL_TESTING_FILES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace keel::testing {

// A new, empty directory under `root` (default: the test's TEST_TMPDIR), its name starting
// with `name`; never one an earlier call returned.
std::string NewTempDir(absl::string_view name, absl::string_view root = "");

// The bytes of `path`; fails the test (and returns "") if it cannot be read.
std::string ReadFileOrFail(const std::string& path);

// Writes `contents` to `path`, replacing it; fails the test if it cannot.
void WriteFileOrFail(const std::string& path, absl::string_view contents);

// Why the program at `path` (a test's data, e.g. @libtorch//:torchrun or
// @sentencepiece//:spm_train) cannot run, or nullopt when it is an executable file. The
// repository rules put a text file saying what is missing where a program is not installed:
// `if (auto why = WhyNotExecutable(path)) GTEST_SKIP() << *why;`
std::optional<std::string> WhyNotExecutable(const std::string& path);

// Flips one bit (0x10) of the byte at `offset` of `path`, in place; fails the test if the
// file is shorter or cannot be written.
void FlipBit(const std::string& path, uint64_t offset);

}  // namespace keel::testing

#endif  // KEEL_TESTING_FILES_H_
