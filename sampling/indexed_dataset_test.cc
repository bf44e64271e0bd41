#include "sampling/indexed_dataset.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kDataLoss = absl::StatusCode::kDataLoss;

std::string TempPrefix(const std::string& name) {
  static const std::string* const dir = new std::string(keel::testing::NewTempDir("datasets"));
  return absl::StrCat(*dir, "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  const at::Tensor longs = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(longs.data_ptr<int64_t>(), longs.data_ptr<int64_t>() + longs.numel());
}

// Three documents: {[1, 2, 3], [4]}, {[5, 6]} and {[]}.
void WriteSmall(const std::string& prefix, TokenDtype dtype) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto writer, IndexedDatasetWriter::Create(prefix, dtype));
  KEEL_ASSERT_OK(writer.AddItem({1, 2, 3}));
  KEEL_ASSERT_OK(writer.AddItem({4}));
  writer.EndDocument();
  const std::vector<int64_t> tokens = {5, 6};
  const std::vector<int64_t> lengths = {2};
  KEEL_ASSERT_OK(writer.AddDocument(tokens, lengths));
  KEEL_ASSERT_OK(writer.AddItem({}));
  writer.EndDocument();
  KEEL_ASSERT_OK(writer.Finalize());
}

TEST(IndexedDatasetTest, WritesMegatronsIndexBytes) {
  // The layout of megatron/core/datasets/indexed_dataset.py's _IndexWriter, byte by byte:
  // magic, version 1, dtype code 8 (uint16), N = 4, D = 4, lengths (int32), pointers
  // (int64, 2 bytes per token), document indices (int64).
  const std::string prefix = TempPrefix("bytes");
  WriteSmall(prefix, TokenDtype::kUint16);
  std::string expected("MMIDIDX\0\0", 9);
  auto u64 = [&](uint64_t v) { expected.append(reinterpret_cast<const char*>(&v), 8); };
  auto i32 = [&](int32_t v) { expected.append(reinterpret_cast<const char*>(&v), 4); };
  u64(1);
  expected.push_back('\x08');
  u64(4);
  u64(4);
  for (int32_t length : {3, 1, 2, 0}) i32(length);
  for (uint64_t pointer : {0, 6, 8, 12}) u64(pointer);
  for (uint64_t document : {0, 2, 3, 4}) u64(document);
  EXPECT_EQ(keel::testing::ReadFileOrFail(prefix + ".idx"), expected);
  EXPECT_EQ(keel::testing::ReadFileOrFail(prefix + ".bin"),
            std::string("\1\0\2\0\3\0\4\0\5\0\6\0", 12));
}

TEST(IndexedDatasetTest, RoundTripsEveryDtype) {
  for (TokenDtype dtype :
       {TokenDtype::kUint8, TokenDtype::kInt8, TokenDtype::kInt16, TokenDtype::kInt32,
        TokenDtype::kInt64, TokenDtype::kFloat64, TokenDtype::kFloat32, TokenDtype::kUint16}) {
    SCOPED_TRACE(AbslUnparseFlag(dtype));
    const std::string prefix = TempPrefix(absl::StrCat("round_trip_", AbslUnparseFlag(dtype)));
    WriteSmall(prefix, dtype);
    KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix));
    EXPECT_EQ(dataset.dtype(), dtype);
    EXPECT_EQ(dataset.size(), 4);
    EXPECT_EQ(dataset.num_documents(), 3);
    EXPECT_EQ(dataset.num_tokens(), 6);
    EXPECT_TRUE(dataset.contiguous());
    EXPECT_FALSE(dataset.multimodal());
    EXPECT_EQ(dataset.sequence_length(2), 2);
    EXPECT_EQ(dataset.sequence_pointer(2), 4 * TokenDtypeSize(dtype));
    EXPECT_EQ(dataset.document_index(1), 2);
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor first, dataset.Get(0));
    EXPECT_THAT(ToVector(first), ElementsAre(1, 2, 3));
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor part, dataset.Get(0, /*offset=*/1, /*length=*/1));
    EXPECT_THAT(ToVector(part), ElementsAre(2));
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor empty, dataset.Get(3));
    EXPECT_EQ(empty.numel(), 0);
  }
}

TEST(IndexedDatasetTest, TensorsShareTheMappingAndOutliveTheDataset) {
  const std::string prefix = TempPrefix("zero_copy");
  WriteSmall(prefix, TokenDtype::kInt32);
  at::Tensor tokens;
  {
    KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix));
    KEEL_ASSERT_OK_AND_ASSIGN(tokens, dataset.Get(2));
    const uint8_t* bin = dataset.bin_bytes().data();
    EXPECT_EQ(static_cast<const uint8_t*>(tokens.data_ptr()), bin + 4 * 4);
    EXPECT_EQ(tokens.scalar_type(), at::kInt);
  }
  EXPECT_THAT(ToVector(tokens), ElementsAre(5, 6));  // the dataset is gone, the mapping not
  tokens.fill_(9);                                   // copy-on-write: private to this mapping
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset reopened, IndexedDataset::Open(prefix));
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor again, reopened.Get(2));
  EXPECT_THAT(ToVector(again), ElementsAre(5, 6));
}

TEST(IndexedDatasetTest, Uint16IsAZeroCopyUInt16Tensor) {
  const std::string prefix = TempPrefix("uint16");
  KEEL_ASSERT_OK_AND_ASSIGN(auto writer, IndexedDatasetWriter::Create(prefix, TokenDtype::kUint16));
  KEEL_ASSERT_OK(writer.AddItem({0, 65535, 40000}));
  writer.EndDocument();
  KEEL_ASSERT_OK(writer.Finalize());
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix));
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor tokens, dataset.Get(0));
  EXPECT_EQ(tokens.scalar_type(), at::kUInt16);
  EXPECT_EQ(static_cast<const uint8_t*>(tokens.data_ptr()), dataset.bin_bytes().data());
  EXPECT_THAT(ToVector(tokens), ElementsAre(0, 65535, 40000));
}

TEST(IndexedDatasetTest, MultimodalRoundTrip) {
  const std::string prefix = TempPrefix("multimodal");
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto writer, IndexedDatasetWriter::Create(prefix, TokenDtype::kInt32, /*multimodal=*/true));
  KEEL_ASSERT_OK(writer.AddItem({7, 8}, /*mode=*/1));
  KEEL_ASSERT_OK(writer.AddItem({9}, /*mode=*/-2));
  writer.EndDocument();
  KEEL_ASSERT_OK(writer.Finalize());
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset,
                            IndexedDataset::Open(prefix, /*multimodal=*/true));
  EXPECT_TRUE(dataset.multimodal());
  EXPECT_EQ(dataset.sequence_mode(0), 1);
  EXPECT_EQ(dataset.sequence_mode(1), -2);
  // The header does not say it is multimodal: opening it as text fails, with a hint.
  EXPECT_THAT(IndexedDataset::Open(prefix),
              StatusIs(kDataLoss, HasSubstr("would fit a multimodal dataset")));
  WriteSmall(prefix, TokenDtype::kInt32);
  EXPECT_THAT(IndexedDataset::Open(prefix, /*multimodal=*/true),
              StatusIs(kDataLoss, HasSubstr("would fit a dataset that is not multimodal")));
}

TEST(IndexedDatasetTest, GetRejectsPositionsOutsideTheSequence) {
  const std::string prefix = TempPrefix("get_errors");
  WriteSmall(prefix, TokenDtype::kInt32);
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix));
  const auto kOutOfRange = absl::StatusCode::kOutOfRange;
  EXPECT_THAT(dataset.Get(4), StatusIs(kOutOfRange, HasSubstr("sequence index 4")));
  EXPECT_THAT(dataset.Get(-1), StatusIs(kOutOfRange, HasSubstr("sequence index -1")));
  EXPECT_THAT(dataset.Get(0, 4), StatusIs(kOutOfRange, HasSubstr("offset 4")));
  EXPECT_THAT(dataset.Get(0, 1, 3), StatusIs(kOutOfRange, HasSubstr("length 3")));
  EXPECT_THAT(dataset.Get(0, 1, -1), StatusIs(kOutOfRange, HasSubstr("length -1")));
  EXPECT_THAT(dataset.Get(0, 3), IsOk());  // empty tail
}

TEST(IndexedDatasetTest, MissingFilesAreNotFound) {
  EXPECT_THAT(IndexedDataset::Open(TempPrefix("nothing_here")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nothing_here.idx")));
  const std::string prefix = TempPrefix("no_bin");
  WriteSmall(prefix, TokenDtype::kInt32);
  ASSERT_EQ(std::remove((prefix + ".bin").c_str()), 0);
  EXPECT_THAT(IndexedDataset::Open(prefix),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_bin.bin")));
}

// A user who names a dataset by one of its files is told its prefix.
TEST(IndexedDatasetTest, AFileNameForAPrefixIsToldThePrefix) {
  const std::string prefix = TempPrefix("named");
  WriteSmall(prefix, TokenDtype::kInt32);
  for (const char* extension : {".bin", ".idx"}) {
    EXPECT_THAT(IndexedDataset::Open(prefix + extension),
                StatusIs(absl::StatusCode::kNotFound,
                         AllOf(HasSubstr(absl::StrCat("named", extension, ".idx: ")),
                               HasSubstr("without .bin or .idx: \"" + prefix + "\""))))
        << extension;
  }
}

// Bad files: a valid dataset whose index has one field patched.
class BadIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = TempPrefix(::testing::UnitTest::GetInstance()->current_test_info()->name());
    WriteSmall(prefix_, TokenDtype::kInt32);  // N = 4, D = 4, 4-byte tokens, 24-byte .bin
    index_ = keel::testing::ReadFileOrFail(prefix_ + ".idx");
  }

  template <typename T>
  void Patch(size_t offset, T value) {
    std::memcpy(&index_[offset], &value, sizeof(T));
  }

  absl::Status Open() {
    WriteFile(prefix_ + ".idx", index_);
    return IndexedDataset::Open(prefix_).status();
  }

  static constexpr size_t kLengths = 34;
  static constexpr size_t kPointers = 34 + 4 * 4;
  static constexpr size_t kDocuments = 34 + 12 * 4;

  std::string prefix_;
  std::string index_;
};

TEST_F(BadIndexTest, ValidFileOpens) { EXPECT_THAT(Open(), IsOk()); }

TEST_F(BadIndexTest, TruncatedHeader) {
  index_.resize(20);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("index is 20 bytes, shorter than its "
                                                    "34-byte header")));
}

TEST_F(BadIndexTest, WrongMagic) {
  index_[0] = 'X';
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("bad magic \"XMIDIDX\\x00\\x00\"")));
}

TEST_F(BadIndexTest, UnknownVersion) {
  Patch<uint64_t>(9, 2);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("unknown version 2: only 1 exists")));
}

TEST_F(BadIndexTest, UnknownDtype) {
  index_[17] = 9;
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("unknown dtype code 9")));
  index_[17] = 0;
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("unknown dtype code 0")));
}

TEST_F(BadIndexTest, TruncatedIndex) {
  index_.pop_back();
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("index is 113 bytes but its header (4 "
                                                    "sequences, 4 document indices) needs 114")));
}

TEST_F(BadIndexTest, HugeCountsDoNotOverflow) {
  Patch<uint64_t>(18, ~uint64_t{0});
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("needs more than 2^64")));
}

TEST_F(BadIndexTest, EveryTruncationIsAnError) {
  const std::string valid = index_;
  for (size_t size = 0; size < valid.size(); ++size) {
    index_ = valid.substr(0, size);
    EXPECT_THAT(Open(), StatusIs(kDataLoss, ::testing::_)) << size;
  }
}

TEST_F(BadIndexTest, DocumentIndicesMustStartAtZero) {
  Patch<int64_t>(kDocuments, 1);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("document_indices[0] is 1: must be 0")));
}

TEST_F(BadIndexTest, DocumentIndicesMustNotDecrease) {
  Patch<int64_t>(kDocuments + 8, 5);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("document_indices[2] is 3: must be >= the "
                                                    "one before (5)")));
}

TEST_F(BadIndexTest, DocumentIndicesMustEndAtSequenceCount) {
  Patch<int64_t>(kDocuments + 24, 3);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("document_indices ends at 3: must end at "
                                                    "the sequence count (4)")));
}

TEST_F(BadIndexTest, DocumentIndicesMustNotBeEmpty) {
  Patch<uint64_t>(26, 0);
  index_.resize(kDocuments);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("document_indices is empty")));
}

TEST_F(BadIndexTest, NegativeLength) {
  Patch<int32_t>(kLengths + 4, -1);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence_lengths[1] is -1: must be >= 0")));
}

TEST_F(BadIndexTest, PointerPastTheEndOfBin) {
  Patch<int64_t>(kPointers + 8 * 3, 28);  // the empty sequence, after the 24 bytes
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence 3 (0 tokens at byte 28) ends past "
                                                    "the end of the .bin (24 bytes)")));
  Patch<int64_t>(kPointers + 8 * 3, 24);  // an empty sequence at the very end is fine
  EXPECT_THAT(Open(), IsOk());
}

TEST_F(BadIndexTest, SequenceEndingPastTheEndOfBin) {
  Patch<int32_t>(kLengths + 8, 3);  // sequence 2: 3 tokens at byte 16
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence 2 (3 tokens at byte 16) ends past "
                                                    "the end of the .bin (24 bytes)")));
}

TEST_F(BadIndexTest, TruncatedBin) {
  std::string bin = keel::testing::ReadFileOrFail(prefix_ + ".bin");
  bin.resize(20);
  WriteFile(prefix_ + ".bin", bin);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("ends past the end of the .bin (20 bytes)")));
}

TEST_F(BadIndexTest, OverlappingPointers) {
  Patch<int64_t>(kPointers + 8, 8);  // sequence 0 covers bytes 0..11
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence_pointers[1] is 8: must be >= the "
                                                    "end of the sequence before (12)")));
}

TEST_F(BadIndexTest, MisalignedPointer) {
  Patch<int64_t>(kPointers + 16, 17);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence_pointers[2] is 17: must be a "
                                                    "multiple of the item size (4)")));
}

TEST_F(BadIndexTest, NegativePointer) {
  Patch<int64_t>(kPointers, -4);
  EXPECT_THAT(Open(), StatusIs(kDataLoss, HasSubstr("sequence_pointers[0] is -4")));
}

TEST_F(BadIndexTest, GapsAreValidButNotContiguous) {
  std::string bin = keel::testing::ReadFileOrFail(prefix_ + ".bin");
  bin.insert(12, 4, '\0');  // 4 bytes between sequences 0 and 1
  WriteFile(prefix_ + ".bin", bin);
  Patch<int64_t>(kPointers + 8, 16);
  Patch<int64_t>(kPointers + 16, 20);
  Patch<int64_t>(kPointers + 24, 28);
  WriteFile(prefix_ + ".idx", index_);
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset dataset, IndexedDataset::Open(prefix_));
  EXPECT_FALSE(dataset.contiguous());
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor tokens, dataset.Get(2));
  EXPECT_THAT(ToVector(tokens), ElementsAre(5, 6));
}

TEST(IndexedDatasetWriterTest, RejectsTokensThatDoNotFit) {
  const auto kInvalidArgument = absl::StatusCode::kInvalidArgument;
  struct Case {
    TokenDtype dtype;
    int64_t token;
  };
  for (const Case& c :
       {Case{TokenDtype::kUint8, 256}, Case{TokenDtype::kUint8, -1}, Case{TokenDtype::kInt8, 128},
        Case{TokenDtype::kUint16, 65536}, Case{TokenDtype::kInt16, -32769},
        Case{TokenDtype::kInt32, 1LL << 31}, Case{TokenDtype::kFloat32, (1 << 24) + 1},
        Case{TokenDtype::kFloat64, (1LL << 53) + 1}}) {
    SCOPED_TRACE(AbslUnparseFlag(c.dtype));
    KEEL_ASSERT_OK_AND_ASSIGN(auto writer,
                              IndexedDatasetWriter::Create(TempPrefix("fit"), c.dtype));
    EXPECT_THAT(writer.AddItem({0, c.token}),
                StatusIs(kInvalidArgument,
                         HasSubstr(absl::StrCat("token 1 (", c.token, ") does not fit dtype"))));
  }
}

TEST(IndexedDatasetWriterTest, RejectsMisuse) {
  const auto kInvalidArgument = absl::StatusCode::kInvalidArgument;
  const auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;
  KEEL_ASSERT_OK_AND_ASSIGN(auto writer,
                            IndexedDatasetWriter::Create(TempPrefix("misuse"), TokenDtype::kInt32));
  EXPECT_THAT(writer.AddItem({1}, /*mode=*/3),
              StatusIs(kInvalidArgument, HasSubstr("mode (3) needs a multimodal dataset")));
  const std::vector<int64_t> tokens = {1, 2, 3};
  const std::vector<int64_t> lengths = {1, 1};
  EXPECT_THAT(writer.AddDocument(tokens, lengths),
              StatusIs(kInvalidArgument, HasSubstr("lengths add up to 2 but 3 tokens")));
  KEEL_ASSERT_OK(writer.AddItem({1}));
  EXPECT_THAT(writer.Finalize(),
              StatusIs(kFailedPrecondition, HasSubstr("sequences 0 to 0 belong to no document")));
  writer.EndDocument();
  KEEL_EXPECT_OK(writer.Finalize());
  EXPECT_THAT(writer.Finalize(), StatusIs(kFailedPrecondition, HasSubstr("twice")));
  EXPECT_THAT(writer.AddItem({1}), StatusIs(kFailedPrecondition, HasSubstr("after Finalize")));
}

// A missing directory is kNotFound, as base::ErrnoCode maps ENOENT for every file operation.
TEST(IndexedDatasetWriterTest, CannotCreateInMissingDirectory) {
  EXPECT_THAT(IndexedDatasetWriter::Create("/nonexistent/dir/x", TokenDtype::kInt32),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/dir/x.bin")));
}

TEST(TokenDtypeTest, SpellingsSizesAndOptimalDtype) {
  TokenDtype dtype;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("uint16", &dtype, &error));
  EXPECT_EQ(dtype, TokenDtype::kUint16);
  EXPECT_EQ(AbslUnparseFlag(TokenDtype::kFloat64), "float64");
  EXPECT_FALSE(AbslParseFlag("int", &dtype, &error));
  EXPECT_EQ(TokenDtypeSize(TokenDtype::kUint16), 2);
  EXPECT_EQ(TokenDtypeSize(TokenDtype::kFloat32), 4);
  EXPECT_EQ(OptimalTokenDtype(65499), TokenDtype::kUint16);
  EXPECT_EQ(OptimalTokenDtype(65500), TokenDtype::kInt32);
  EXPECT_EQ(OptimalTokenDtype(std::nullopt), TokenDtype::kInt32);
}

}  // namespace
}  // namespace keel::sampling
