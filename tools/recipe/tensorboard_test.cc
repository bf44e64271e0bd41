#include "tools/recipe/tensorboard.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/tensorboard_event.pb.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// CRC-32C bit by bit, independent of the table-driven one under test.
uint32_t BitwiseCrc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t BitwiseMasked(absl::string_view data) {
  const uint32_t crc = BitwiseCrc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t LittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = bytes.size(); i > 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i - 1]);
  }
  return value;
}

std::string Bytes(uint64_t value, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  return out;
}

std::string DoubleBytes(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return Bytes(bits, 8);
}

std::string FloatBytes(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return Bytes(bits, 4);
}

// Splits a TFRecord file into record payloads, checking lengths and both masked CRCs.
std::vector<std::string> ReadRecords(const std::string& file) {
  std::vector<std::string> records;
  absl::string_view rest = file;
  while (!rest.empty()) {
    EXPECT_GE(rest.size(), 12u) << "truncated record header";
    if (rest.size() < 12) break;
    const uint64_t length = LittleEndian(rest.substr(0, 8));
    EXPECT_EQ(LittleEndian(rest.substr(8, 4)), BitwiseMasked(rest.substr(0, 8)));
    EXPECT_GE(rest.size(), 16 + length) << "truncated record";
    if (rest.size() < 16 + length) break;
    const absl::string_view data = rest.substr(12, length);
    EXPECT_EQ(LittleEndian(rest.substr(12 + length, 4)), BitwiseMasked(data));
    records.emplace_back(data);
    rest.remove_prefix(16 + length);
  }
  return records;
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

TEST(Crc32cTest, MatchesCheckValueAndRfc3720Vectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);              // the catalogued CRC-32C check value
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);    // RFC 3720 B.4: 32 bytes of zeros
  EXPECT_EQ(Crc32c(std::string(32, '\xFF')), 0x62A8AB43u);  // 32 bytes of 0xFF
  std::string increasing;
  std::string decreasing;
  for (int i = 0; i < 32; ++i) {
    increasing.push_back(static_cast<char>(i));
    decreasing.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(increasing), 0x46DD794Eu);  // 0x00 .. 0x1F
  EXPECT_EQ(Crc32c(decreasing), 0x113FDB5Cu);  // 0x1F .. 0x00
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, AgreesWithBitwiseCrcOnEveryByteValue) {
  std::string data;
  for (int i = 0; i < 1000; ++i) {
    data.push_back(static_cast<char>((i * 131 + 7) & 0xFF));
    ASSERT_EQ(Crc32c(data), BitwiseCrc32c(data)) << "length " << data.size();
  }
}

TEST(Crc32cTest, MaskRotatesRightBy15AndAddsConstant) {
  // crc("123456789") = 0xE3069283; rotated right by 15 = 0x0001C60D | 0x25060000 = 0x2507C60D;
  // + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(MaskedCrc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(MaskedCrc32c(""), 0xA282EAD8u);  // crc 0 rotates to 0
}

TEST(TensorBoardWriterTest, WritesFramedEventsTensorBoardCanRead) {
  const std::string dir = absl::StrCat(NewTempDir("tb_events"), "/run");  // created by Create
  const double start = 1700000000.25;
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter writer, TensorBoardWriter::Create(dir, start));
  EXPECT_EQ(writer.path(),
            absl::StrCat(dir, "/events.out.tfevents.1700000000.", HostName(), ".keel"));
  KEEL_ASSERT_OK(writer.AddScalar("train/loss", 1, 2.5, start + 1));
  KEEL_ASSERT_OK(writer.AddScalar("train/lr", 1, 3e-4, start + 1));
  KEEL_ASSERT_OK(writer.AddScalar("train/loss", 2, 2.25, start + 2));
  KEEL_ASSERT_OK(writer.Flush());

  const std::vector<std::string> records = ReadRecords(ReadFileOrFail(writer.path()));
  ASSERT_THAT(records, SizeIs(4));

  // The wire bytes, field by field (event.proto / summary.proto numbers): key 0x09 = field 1
  // fixed64, 0x10 = field 2 varint, 0x1A = field 3 bytes, 0x2A = field 5 bytes; inside
  // Summary 0x0A = field 1 bytes; inside Value 0x0A = tag, 0x15 = field 2 fixed32.
  EXPECT_EQ(records[0], absl::StrCat("\x09", DoubleBytes(start), "\x1A\x0D", "brain.Event:2"));
  const std::string value = absl::StrCat("\x0A\x0A", "train/loss", "\x15", FloatBytes(2.5f));
  const std::string summary = absl::StrCat("\x0A", std::string(1, char(value.size())), value);
  EXPECT_EQ(records[1], absl::StrCat("\x09", DoubleBytes(start + 1), std::string("\x10\x01", 2),
                                     "\x2A", std::string(1, char(summary.size())), summary));

  tensorboard::Event event;
  ASSERT_TRUE(event.ParseFromString(records[0]));
  EXPECT_EQ(event.wall_time(), start);
  EXPECT_EQ(event.file_version(), "brain.Event:2");
  ASSERT_TRUE(event.ParseFromString(records[2]));
  EXPECT_EQ(event.wall_time(), start + 1);
  EXPECT_EQ(event.step(), 1);
  ASSERT_EQ(event.summary().value_size(), 1);
  EXPECT_EQ(event.summary().value(0).tag(), "train/lr");
  EXPECT_EQ(event.summary().value(0).simple_value(), 3e-4f);
  ASSERT_TRUE(event.ParseFromString(records[3]));
  EXPECT_EQ(event.step(), 2);
  EXPECT_EQ(event.summary().value(0).simple_value(), 2.25f);
}

TEST(TensorBoardWriterTest, NeverOverwritesAnEventFileOfTheSameName) {
  const std::string dir = NewTempDir("tb_twice");
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter first, TensorBoardWriter::Create(dir, 5.0));
  KEEL_ASSERT_OK(first.AddScalar("loss", 1, 1.0, 6.0));
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter second, TensorBoardWriter::Create(dir, 5.0));
  EXPECT_EQ(second.path(), absl::StrCat(first.path(), ".1"));
  EXPECT_THAT(ReadRecords(ReadFileOrFail(first.path())), SizeIs(2));
  EXPECT_THAT(ReadRecords(ReadFileOrFail(second.path())), SizeIs(1));
}

TEST(TensorBoardWriterTest, RejectsEmptyTag) {
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter writer,
                            TensorBoardWriter::Create(NewTempDir("tb_tag"), 1.0));
  EXPECT_THAT(writer.AddScalar("", 3, 1.0, 2.0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag must not be empty")));
}

TEST(TensorBoardWriterTest, MissingParentDirectoryNamesIt) {
  const std::string dir = absl::StrCat(NewTempDir("tb_missing"), "/no/such/dir");
  EXPECT_THAT(TensorBoardWriter::Create(dir, 1.0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

}  // namespace
}  // namespace keel::tools::recipe
