#include "checkpoint/internal/files.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint::internal {
namespace {

using Mode = OutputFile::Mode;

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

std::string LittleEndian(uint64_t value) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return bytes;
}

// The chunk checksum from its definition: XXH3 of the 16 MiB segments' XXH3 digests.
uint64_t ChunkChecksum(const std::string& chunk) {
  std::vector<uint64_t> digests;
  for (size_t start = 0; start < chunk.size(); start += kChecksumSegment) {
    const size_t length = std::min(kChecksumSegment, chunk.size() - start);
    digests.push_back(Xxh3(chunk.data() + start, length));
  }
  return CombineSegments(digests);
}

// A header, padding, a chunk spanning several write blocks with an unaligned end, and a tail:
// the file holds exactly those bytes, and its checksums follow their definitions, whether the
// blocks went out with O_DIRECT or through the page cache.
TEST(OutputFileTest, WritesExactBytesAndChecksumsInEveryMode) {
  const std::string header = RandomBytes(100, 1);
  const std::string chunk = RandomBytes((size_t{33} << 20) + 12345, 2);
  const std::string tail = "the end";
  for (const Mode mode : {Mode::kDirectIfSupported, Mode::kBuffered}) {
    SCOPED_TRACE(mode == Mode::kBuffered ? "buffered" : "direct if supported");
    const std::string path = absl::StrCat(keel::testing::NewTempDir("file"), "/file",
                                          mode == Mode::kBuffered ? "_buffered" : "_direct");
    KEEL_ASSERT_OK_AND_ASSIGN(OutputFile file, OutputFile::Create(path, mode));
    if (mode == Mode::kBuffered) {
      EXPECT_FALSE(file.direct());
    }
    KEEL_ASSERT_OK(file.Write(header.data(), header.size()));
    KEEL_ASSERT_OK(file.PadTo(4096));
    EXPECT_EQ(file.size(), 4096u);
    KEEL_ASSERT_OK_AND_ASSIGN(uint64_t checksum, file.WriteChunk(chunk.data(), chunk.size()));
    KEEL_ASSERT_OK(file.Write(tail.data(), tail.size()));
    KEEL_ASSERT_OK(file.Close());

    const std::string padding(4096 - header.size(), '\0');
    EXPECT_EQ(checksum, ChunkChecksum(chunk));
    const std::string summarised = absl::StrCat(header, padding, LittleEndian(checksum), tail);
    EXPECT_EQ(file.checksum(), Xxh3(summarised.data(), summarised.size()));
    const std::string expected = absl::StrCat(header, padding, chunk, tail);
    EXPECT_EQ(file.size(), expected.size());
    const std::string written = keel::testing::ReadFileOrFail(path);
    EXPECT_EQ(written.size(), expected.size());
    EXPECT_TRUE(written == expected);  // not EXPECT_EQ: 33 MiB in a failure message
  }
}

TEST(OutputFileTest, MissingDirectoryIsNotFoundNamingThePath) {
  EXPECT_THAT(OutputFile::Create("/nonexistent/dir/file").status(),
              keel::testing::StatusIs(absl::StatusCode::kNotFound,
                                      ::testing::HasSubstr("/nonexistent/dir/file")));
}

}  // namespace
}  // namespace keel::checkpoint::internal
