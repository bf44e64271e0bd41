#include "tools/recipe/corpus.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::sampling::IndexedDataset;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  static const std::string* const dir = new std::string(keel::testing::NewTempDir("corpus"));
  return absl::StrCat(*dir, "/", name);
}

std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  keel::testing::WriteFileOrFail(path, bytes);
  return path;
}

std::vector<int64_t> Bytes(const std::string& text) {
  return std::vector<int64_t>(reinterpret_cast<const unsigned char*>(text.data()),
                              reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor longs = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel());
}

struct Document {
  std::string file_text;
  std::vector<std::string> paragraphs;  // written out by hand from file_text
};

TEST(BuildByteCorpusTest, WritesOneDocumentPerFileAndOneSequencePerParagraph) {
  const std::vector<Document> documents = {
      {"Hello\nworld\n\nSecond para.\n", {"Hello\nworld\n\n", "Second para.\n"}},
      // Leading blank lines stay with the first paragraph; bytes >= 128 are tokens 128..255.
      {"\n \t\nOne caf\xc3\xa9, no newline at the end",
       {"\n \t\nOne caf\xc3\xa9, no newline at the end"}},
      {"", {}},  // an empty file: a document without sequences, as Megatron writes it
      {"A\n\n\nB\r\n \r\nC", {"A\n\n\n", "B\r\n \r\n", "C"}},
  };
  std::vector<std::string> files;
  for (size_t d = 0; d < documents.size(); ++d) {
    files.push_back(WriteFile(absl::StrCat("doc", d, ".txt"), documents[d].file_text));
  }
  const std::string prefix = TempPath("corpus");
  KEEL_ASSERT_OK_AND_ASSIGN(CorpusStats stats, BuildByteCorpus(files, prefix));

  // 4 files; 2 + 1 + 0 + 3 paragraphs; 26 + 36 + 0 + 11 bytes plus 3 end-of-document tokens.
  EXPECT_EQ(stats.documents, 4);
  EXPECT_EQ(stats.sequences, 6);
  EXPECT_EQ(stats.tokens, 26 + 36 + 0 + 11 + 3);

  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix));
  EXPECT_EQ(dataset.dtype(), sampling::TokenDtype::kUint16);
  ASSERT_EQ(dataset.num_documents(), 4);
  ASSERT_EQ(dataset.size(), 6);
  EXPECT_EQ(dataset.num_tokens(), stats.tokens);
  int64_t sequence = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    SCOPED_TRACE(absl::StrCat("document ", d));
    EXPECT_EQ(dataset.document_index(d), sequence);
    std::string joined;
    for (size_t p = 0; p < documents[d].paragraphs.size(); ++p, ++sequence) {
      SCOPED_TRACE(absl::StrCat("paragraph ", p));
      const std::string& paragraph = documents[d].paragraphs[p];
      joined += paragraph;
      std::vector<int64_t> expected = Bytes(paragraph);
      if (p + 1 == documents[d].paragraphs.size()) expected.push_back(0);  // end of document
      KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor tokens, dataset.Get(sequence));
      EXPECT_EQ(ToVector(tokens), expected);
    }
    EXPECT_EQ(joined, documents[d].file_text);  // the hand-written split loses no byte
  }
  EXPECT_EQ(dataset.document_index(4), 6);
  // The record that tells the trainer these are bytes (a Hugging Face model refuses them).
  KEEL_ASSERT_OK_AND_ASSIGN(std::optional<TokenizerInfo> info, ReadTokenizerInfo(prefix));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->tokenizer_type, TokenizerType::kBytes);
  EXPECT_EQ(info->vocab_size, 256);
  EXPECT_EQ(info->eos_id, 0);
  EXPECT_TRUE(info->append_eod);
}

TEST(BuildByteCorpusTest, RejectsAnEmptyFileList) {
  EXPECT_THAT(BuildByteCorpus({}, TempPath("none")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("text_files")));
}

TEST(BuildByteCorpusTest, RejectsAnEmptyOutputPrefix) {
  const std::string file = WriteFile("ok.txt", "text\n");
  EXPECT_THAT(BuildByteCorpus({file}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output_prefix")));
}

TEST(BuildByteCorpusTest, MissingFileIsNotFoundAndWritesNothing) {
  const std::string file = WriteFile("present.txt", "text\n");
  const std::string missing = TempPath("missing.txt");
  const std::string prefix = TempPath("missing_out");
  EXPECT_THAT(BuildByteCorpus({file, missing}, prefix),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
}

TEST(BuildByteCorpusTest, RejectsADirectory) {
  const std::string dir = TempPath("a_directory");
  std::filesystem::create_directories(dir);
  EXPECT_THAT(BuildByteCorpus({dir}, TempPath("dir_out")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(dir)));
}

TEST(BuildByteCorpusTest, RejectsNulBytesAndRemovesThePartialOutput) {
  const std::string good = WriteFile("good.txt", "fine\n");
  const std::string binary = WriteFile("binary.txt", std::string("abc\0def", 7));
  const std::string prefix = TempPath("nul_out");
  EXPECT_THAT(BuildByteCorpus({good, binary}, prefix),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(binary, " holds byte 0 at offset 3"))));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".tokenizer.json"));
}

// An output in a missing directory is kNotFound, as base::ErrnoCode maps ENOENT everywhere.
TEST(BuildByteCorpusTest, OutputInAMissingDirectoryIsNotFound) {
  const std::string file = WriteFile("text.txt", "text\n");
  EXPECT_THAT(BuildByteCorpus({file}, TempPath("no/such/dir/out")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/dir/out")));
}

TEST(DefaultCorpusFilesTest, ListsReadableLicenseTextsSortedWithoutDuplicates) {
  const std::vector<std::string> files = DefaultCorpusFiles();
  ASSERT_THAT(files, Not(IsEmpty()));
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
  EXPECT_EQ(std::adjacent_find(files.begin(), files.end()), files.end());
  // base-files ships GPL-3 as a regular file (GPL is the symlink to it).
  EXPECT_THAT(files, ::testing::Contains("/usr/share/common-licenses/GPL-3"));
  int64_t bytes = 0;
  for (const std::string& file : files) {
    SCOPED_TRACE(file);
    EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(file)));
    std::ifstream in(file, std::ios::binary);
    ASSERT_TRUE(in.good());
    bytes += static_cast<int64_t>(std::filesystem::file_size(file));
  }
  // Every license text is non-empty and NUL-free: one document, and one EOD token, per file.
  KEEL_ASSERT_OK_AND_ASSIGN(CorpusStats stats, BuildByteCorpus(files, TempPath("licenses")));
  EXPECT_EQ(stats.documents, static_cast<int64_t>(files.size()));
  EXPECT_EQ(stats.tokens, bytes + static_cast<int64_t>(files.size()));
}

}  // namespace
}  // namespace keel::tools::recipe
