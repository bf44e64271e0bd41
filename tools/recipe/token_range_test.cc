// The token check reads every token once per dataset: a matching record answers later checks
// (a token changed behind the record's back is not seen: the scan did not run), new files are
// scanned again, a record that says a token is out of range gives the scan's precise error, and
// a cache that cannot be written only costs a scan, as does a record whose range is no int64_t.
#include "tools/recipe/token_range.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// Two documents of uint16 tokens 1..299 at `prefix`.
void WriteDataset(const std::string& prefix) {
  auto writer = sampling::IndexedDatasetWriter::Create(prefix, sampling::TokenDtype::kUint16);
  ASSERT_TRUE(writer.ok());
  std::vector<int64_t> tokens;
  for (int64_t t = 1; t < 300; ++t) tokens.push_back(t);
  KEEL_ASSERT_OK(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}));
  KEEL_ASSERT_OK(writer->AddDocument({5, 6, 7}, {3}));
  KEEL_ASSERT_OK(writer->Finalize());
}

// Writes token `value` at token position `at` of the .bin, keeping its modification time.
void OverwriteToken(const std::string& prefix, int64_t at, uint16_t value) {
  const std::string bin = prefix + ".bin";
  struct stat before {};
  ASSERT_EQ(::stat(bin.c_str(), &before), 0);
  absl::StatusOr<std::string> bytes = base::ReadFile(bin);
  ASSERT_TRUE(bytes.ok());
  bytes->replace(2 * at, 2, reinterpret_cast<const char*>(&value), 2);
  KEEL_ASSERT_OK(base::WriteFile(bin, *bytes));
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, bin.c_str(), times, 0), 0);
}

// CheckTokenRange on the dataset at `prefix`, opened afresh.
absl::Status CheckFiles(const std::string& prefix, int64_t vocab_size, const std::string& cache) {
  KEEL_ASSIGN_OR_RETURN(sampling::IndexedDataset dataset, sampling::IndexedDataset::Open(prefix));
  return CheckTokenRange(dataset, prefix, vocab_size, cache);
}

TEST(TokenRangeTest, OneScanPerDatasetThenTheRecordAnswers) {
  const std::string dir = keel::testing::NewTempDir("token_range");
  const std::string prefix = dir + "/tokens";
  const std::string cache = dir + "/cache";
  WriteDataset(prefix);
  {
    KEEL_ASSERT_OK_AND_ASSIGN(sampling::IndexedDataset dataset,
                              sampling::IndexedDataset::Open(prefix));
    KEEL_ASSERT_OK(CheckTokenRange(dataset, prefix, 300, cache));
    EXPECT_TRUE(base::PathExists(TokenRangePath(prefix, cache)));
  }
  // A token out of range written behind the record (size and time kept): the record answers,
  // so no scan sees it.
  OverwriteToken(prefix, 10, 999);
  {
    KEEL_ASSERT_OK_AND_ASSIGN(sampling::IndexedDataset dataset,
                              sampling::IndexedDataset::Open(prefix));
    KEEL_EXPECT_OK(CheckTokenRange(dataset, prefix, 300, cache));
    // A smaller vocabulary than the record's range: the scan names the token itself.
    EXPECT_THAT(CheckTokenRange(dataset, prefix, 200, cache),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("token 999 of " + prefix +
                                   " (token 10 of its .bin) is outside [0, model.vocab_size = "
                                   "200)")));
  }
  // New files (another modification time): scanned again.
  const std::string bin = prefix + ".bin";
  ASSERT_EQ(::utimes(bin.c_str(), nullptr), 0);
  EXPECT_THAT(CheckFiles(prefix, 300, cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 999 of")));
}

// A record whose range is no int64_t (2^64 - 1 once read as -1, inside any vocabulary) is no
// answer: the check scans again.
TEST(TokenRangeTest, ARecordPastInt64IsScannedAgain) {
  const std::string dir = keel::testing::NewTempDir("token_range_u64");
  const std::string prefix = dir + "/tokens";
  const std::string cache = dir + "/cache";
  WriteDataset(prefix);
  KEEL_ASSERT_OK(CheckFiles(prefix, 300, cache));
  const std::string record = TokenRangePath(prefix, cache);
  KEEL_ASSERT_OK_AND_ASSIGN(base::Json json, base::ReadJsonFile(record));
  json["max_token"] = UINT64_MAX;
  KEEL_ASSERT_OK(base::WriteJsonFile(record, json));
  OverwriteToken(prefix, 10, 999);
  EXPECT_THAT(CheckFiles(prefix, 300, cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 999 of")));
}

TEST(TokenRangeTest, AnUnwritableCacheOnlyCostsAScan) {
  const std::string dir = keel::testing::NewTempDir("token_range_ro");
  const std::string prefix = dir + "/tokens";
  WriteDataset(prefix);
  const std::string cache = dir + "/file_not_directory";
  KEEL_ASSERT_OK(base::WriteFile(cache, "x"));
  KEEL_ASSERT_OK_AND_ASSIGN(sampling::IndexedDataset dataset,
                            sampling::IndexedDataset::Open(prefix));
  KEEL_EXPECT_OK(CheckTokenRange(dataset, prefix, 300, cache));
  EXPECT_FALSE(base::PathExists(TokenRangePath(prefix, cache)));
  EXPECT_THAT(CheckTokenRange(dataset, prefix, 299, cache),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 299 of")));
}

}  // namespace
}  // namespace keel::tools::recipe
