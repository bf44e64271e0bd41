#include "tools/metrics.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "tools/tensorboard_event.pb.h"

namespace keel::tools {
namespace {

using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

// A fresh directory under TEST_TMPDIR.
std::string TempDir(absl::string_view name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

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

StepMetrics Metrics(int64_t step, double loss, double lr) {
  StepMetrics m;
  m.step = step;
  m.epoch = step / 10;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = 0.5;
  m.tokens_per_second = 1000;
  m.elapsed_seconds = static_cast<double>(step);
  return m;
}

void ExpectSameMetrics(const StepMetrics& actual, const StepMetrics& expected) {
  EXPECT_EQ(actual.step, expected.step);
  EXPECT_EQ(actual.epoch, expected.epoch);
  if (std::isnan(expected.loss)) {
    EXPECT_TRUE(std::isnan(actual.loss));
  } else {
    EXPECT_EQ(actual.loss, expected.loss);
  }
  EXPECT_EQ(actual.lr, expected.lr);
  EXPECT_EQ(actual.grad_norm, expected.grad_norm);
  EXPECT_EQ(actual.tokens_per_second, expected.tokens_per_second);
  EXPECT_EQ(actual.elapsed_seconds, expected.elapsed_seconds);
  EXPECT_EQ(actual.val_loss, expected.val_loss);
}

std::vector<int64_t> Steps(const std::vector<StepMetrics>& history) {
  std::vector<int64_t> steps;
  for (const StepMetrics& m : history) steps.push_back(m.step);
  return steps;
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
  const std::string dir = absl::StrCat(TempDir("tb_events"), "/run");  // created by Create
  const double start = 1700000000.25;
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter writer, TensorBoardWriter::Create(dir, start));
  EXPECT_EQ(writer.path(),
            absl::StrCat(dir, "/events.out.tfevents.1700000000.", HostName(), ".keel"));
  KEEL_ASSERT_OK(writer.AddScalar("train/loss", 1, 2.5, start + 1));
  KEEL_ASSERT_OK(writer.AddScalar("train/lr", 1, 3e-4, start + 1));
  KEEL_ASSERT_OK(writer.AddScalar("train/loss", 2, 2.25, start + 2));
  KEEL_ASSERT_OK(writer.Flush());

  const std::vector<std::string> records = ReadRecords(ReadAll(writer.path()));
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
  const std::string dir = TempDir("tb_twice");
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter first, TensorBoardWriter::Create(dir, 5.0));
  KEEL_ASSERT_OK(first.AddScalar("loss", 1, 1.0, 6.0));
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter second, TensorBoardWriter::Create(dir, 5.0));
  EXPECT_EQ(second.path(), absl::StrCat(first.path(), ".1"));
  EXPECT_THAT(ReadRecords(ReadAll(first.path())), SizeIs(2));
  EXPECT_THAT(ReadRecords(ReadAll(second.path())), SizeIs(1));
}

TEST(TensorBoardWriterTest, RejectsEmptyTag) {
  KEEL_ASSERT_OK_AND_ASSIGN(TensorBoardWriter writer,
                            TensorBoardWriter::Create(TempDir("tb_tag"), 1.0));
  EXPECT_THAT(writer.AddScalar("", 3, 1.0, 2.0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag must not be empty")));
}

TEST(TensorBoardWriterTest, MissingParentDirectoryNamesIt) {
  const std::string dir = absl::StrCat(TempDir("tb_missing"), "/no/such/dir");
  EXPECT_THAT(TensorBoardWriter::Create(dir, 1.0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir)));
}

TEST(JsonlWriterTest, WritesOneObjectPerLineInFieldOrder) {
  const std::string path = absl::StrCat(TempDir("jsonl_line"), "/metrics.jsonl");
  KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
  StepMetrics m = Metrics(3, 2.5, 0.25);
  KEEL_ASSERT_OK(writer.Write(m));
  m.step = 4;
  m.val_loss = 2.0;
  KEEL_ASSERT_OK(writer.Write(m));
  EXPECT_EQ(ReadAll(path),
            "{\"step\":3,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
            "\"tokens_per_second\":1000.0,\"elapsed_seconds\":3.0,\"val_loss\":null}\n"
            "{\"step\":4,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
            "\"tokens_per_second\":1000.0,\"elapsed_seconds\":3.0,\"val_loss\":2.0}\n");
}

TEST(JsonlWriterTest, RoundTripsDoublesExactly) {
  const std::string path = absl::StrCat(TempDir("jsonl_round_trip"), "/metrics.jsonl");
  std::vector<StepMetrics> written = {
      Metrics(1, 0.1, 3e-4),
      Metrics(2, 1.0 / 3.0, std::numeric_limits<double>::denorm_min()),
      Metrics(3, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::max()),
      Metrics(4, std::numeric_limits<double>::infinity(), 2.0 / 7.0),
  };
  written[1].val_loss = 0.30000000000000004;
  written[2].grad_norm = -std::numeric_limits<double>::infinity();
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    for (const StepMetrics& m : written) KEEL_ASSERT_OK(writer.Write(m));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  ASSERT_EQ(read.size(), written.size());
  for (size_t i = 0; i < read.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("record ", i));
    ExpectSameMetrics(read[i], written[i]);
  }
}

TEST(JsonlWriterTest, AppendContinuesAndTruncateStartsOver) {
  const std::string path = absl::StrCat(TempDir("jsonl_append"), "/metrics.jsonl");
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    for (int64_t step : {1, 2, 3}) KEEL_ASSERT_OK(writer.Write(Metrics(step, 3.0, 1e-3)));
  }
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    KEEL_ASSERT_OK(writer.Write(Metrics(4, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(std::vector<std::string>(absl::StrSplit(ReadAll(path), '\n', absl::SkipEmpty())),
              SizeIs(4));
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    KEEL_ASSERT_OK(writer.Write(Metrics(7, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(7));
}

TEST(JsonlWriterTest, ResumedRunReplacesTheStepsItReplays) {
  const std::string path = absl::StrCat(TempDir("jsonl_resume"), "/metrics.jsonl");
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    for (int64_t step : {1, 2, 3, 4}) KEEL_ASSERT_OK(writer.Write(Metrics(step, 3.0, 1e-3)));
  }
  {  // Resumed from the checkpoint at step 2: steps 3 and 4 run again.
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    for (int64_t step : {3, 4, 5}) KEEL_ASSERT_OK(writer.Write(Metrics(step, 1.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(read[1].loss, 3.0);
  EXPECT_EQ(read[2].loss, 1.0);
  EXPECT_EQ(read[3].loss, 1.0);
}

TEST(JsonlWriterTest, AppendCutsOffAPartialLastLine) {
  const std::string path = absl::StrCat(TempDir("jsonl_partial"), "/metrics.jsonl");
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    KEEL_ASSERT_OK(writer.Write(Metrics(1, 3.0, 1e-3)));
  }
  const std::string whole = ReadAll(path);
  WriteText(path, absl::StrCat(whole, "{\"step\":2,\"epo"));  // a crash in mid-write
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    KEEL_ASSERT_OK(writer.Write(Metrics(2, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(1, 2));

  WriteText(path, absl::StrCat(whole, "{\"step\":2,\"epo"));
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));  // readable before any resume
  EXPECT_THAT(Steps(read), ElementsAre(1));

  WriteText(path, "{\"step\":1,");  // nothing but a partial line
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    KEEL_ASSERT_OK(writer.Write(Metrics(9, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(9));
}

TEST(JsonlWriterTest, UnwritablePathNamesIt) {
  const std::string path = absl::StrCat(TempDir("jsonl_missing"), "/no_such_dir/metrics.jsonl");
  EXPECT_THAT(JsonlWriter::Create(path, /*append=*/false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(JsonlWriter::Create(path, /*append=*/true),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(ReadJsonlTest, Errors) {
  const std::string dir = TempDir("jsonl_errors");
  const std::string missing = absl::StrCat(dir, "/absent.jsonl");
  EXPECT_THAT(ReadJsonl(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));

  const std::string good =
      "{\"step\":1,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
      "\"tokens_per_second\":1000.0,\"elapsed_seconds\":3.0}\n";
  const std::string path = absl::StrCat(dir, "/bad.jsonl");
  WriteText(path, absl::StrCat(good, "\n", "not json\n"));
  EXPECT_THAT(ReadJsonl(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + ":3: ")));
  WriteText(path, absl::StrCat(good, "[1, 2]\n"));
  EXPECT_THAT(ReadJsonl(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("JSON object")));
  WriteText(path, "{\"step\":1,\"epoch\":0,\"loss\":2.5}\n");
  EXPECT_THAT(ReadJsonl(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(":1: missing field \"lr\"")));
  WriteText(path, absl::StrCat(good,
                               "{\"step\":2.5,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,"
                               "\"grad_norm\":0.5,\"tokens_per_second\":1.0,"
                               "\"elapsed_seconds\":3.0,\"val_loss\":null}\n"));
  EXPECT_THAT(ReadJsonl(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(":2: step must be an integer")));

  WriteText(path, good);  // val_loss may be absent
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  ASSERT_THAT(read, SizeIs(1));
  EXPECT_EQ(read[0].val_loss, std::nullopt);
}

// Checks that every start tag has its end tag, in order, and that nothing follows the root.
void ExpectWellFormed(const std::string& svg) {
  std::vector<std::string> open;
  size_t pos = 0;
  bool closed_root = false;
  while ((pos = svg.find('<', pos)) != std::string::npos) {
    ASSERT_FALSE(closed_root) << "content after </svg> at " << pos;
    const size_t end = svg.find('>', pos);
    ASSERT_NE(end, std::string::npos) << "unterminated tag at " << pos;
    const std::string tag = svg.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.empty()) FAIL() << "empty tag";
    if (tag.back() == '/') continue;  // self-closing
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find(' ') - (tag[0] == '/'));
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(open.back(), name);
      open.pop_back();
      closed_root = open.empty();
    } else {
      open.push_back(name);
    }
  }
  EXPECT_TRUE(open.empty());
  EXPECT_TRUE(closed_root);
}

TEST(WriteLossPlotTest, WritesWellFormedSvgWithEverySeries) {
  const std::string dir = TempDir("plot");
  const std::string path = absl::StrCat(dir, "/loss.svg");
  std::vector<StepMetrics> history;
  for (int64_t step = 1; step <= 200; ++step) {
    StepMetrics m = Metrics(step, 4.0 / std::sqrt(static_cast<double>(step)), 3e-4 * step / 200);
    if (step % 50 == 0) m.val_loss = m.loss + 0.1;
    history.push_back(m);
  }
  history[100].loss = std::numeric_limits<double>::quiet_NaN();  // a gap, not a point
  KEEL_ASSERT_OK(WriteLossPlot(path, history));

  const std::string svg = ReadAll(path);
  EXPECT_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  ExpectWellFormed(svg);
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"loss\""));
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"lr\""));
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"val_loss\""));
  EXPECT_THAT(svg, HasSubstr("training loss"));
  EXPECT_THAT(svg, HasSubstr("validation loss"));
  EXPECT_THAT(svg, HasSubstr("learning rate"));
  EXPECT_THAT(svg, HasSubstr("steps 1 to 200"));
  EXPECT_THAT(svg, HasSubstr(">3.0e-04<"));  // an lr tick label
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_FALSE(Exists(path + ".tmp"));
  // The NaN splits the training-loss line in two.
  size_t loss_lines = 0;
  for (size_t pos = 0; (pos = svg.find("class=\"loss\"", pos)) != std::string::npos; ++pos) {
    ++loss_lines;
  }
  EXPECT_EQ(loss_lines, 2u);
}

TEST(WriteLossPlotTest, SinglePointAndNoValidationLoss) {
  const std::string path = absl::StrCat(TempDir("plot_single"), "/loss.svg");
  KEEL_ASSERT_OK(WriteLossPlot(path, {Metrics(10, 2.0, 1e-4)}));
  const std::string svg = ReadAll(path);
  ExpectWellFormed(svg);
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"lr\""));
  EXPECT_THAT(svg, HasSubstr("<circle"));  // a one-point line would be invisible
  EXPECT_THAT(svg, Not(HasSubstr("validation loss")));
}

TEST(WriteLossPlotTest, LongRunsKeepAtMostFourPointsPerPixelColumn) {
  const std::string path = absl::StrCat(TempDir("plot_long"), "/loss.svg");
  std::vector<StepMetrics> history;
  for (int64_t step = 1; step <= 100000; ++step) {
    history.push_back(Metrics(step, 1.0 + static_cast<double>(step % 7), 1e-4));
  }
  history.back().loss = 1e30;  // a diverged last step still gets readable tick labels
  KEEL_ASSERT_OK(WriteLossPlot(path, history));
  const std::string svg = ReadAll(path);
  ExpectWellFormed(svg);
  const size_t start = svg.find("<polyline class=\"loss\"");
  ASSERT_NE(start, std::string::npos);
  const std::string line = svg.substr(start, svg.find("/>", start) - start);
  // The plot area is 680 pixels wide: 4 * 681 columns at most.
  EXPECT_LE(std::count(line.begin(), line.end(), ','), 4 * 681);
  EXPECT_TRUE(absl::StrContains(svg, ">1.0e+30<"));  // not 31 digits
  EXPECT_TRUE(absl::StrContains(svg, ">100000<"));
}

TEST(WriteLossPlotTest, Errors) {
  const std::string dir = TempDir("plot_errors");
  EXPECT_THAT(WriteLossPlot(absl::StrCat(dir, "/empty.svg"), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metrics is empty")));
  const std::string path = absl::StrCat(dir, "/no_such_dir/loss.svg");
  EXPECT_THAT(WriteLossPlot(path, {Metrics(1, 2.0, 1e-4)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(ProgressLineTest, FormatsEveryColumnAndEta) {
  StepMetrics m;
  m.step = 120;
  m.loss = 2.34123;
  m.lr = 3e-4;
  m.grad_norm = 0.8123;
  m.tokens_per_second = 15234;
  m.elapsed_seconds = 15;  // 0.125 s per step; 880 steps left = 110 s
  EXPECT_EQ(ProgressLine(m, 1000),
            "step  120/1000 | loss 2.3412 | lr 3.00e-04 | grad norm 0.812 | 15.2k tok/s | "
            "ETA 1m50s");
  m.val_loss = 2.5;
  m.tokens_per_second = 950;
  EXPECT_EQ(ProgressLine(m, 1000),
            "step  120/1000 | loss 2.3412 | lr 3.00e-04 | grad norm 0.812 | 950 tok/s | "
            "val loss 2.5000 | ETA 1m50s");
}

TEST(ProgressLineTest, EtaCountsOnlyThisRunsSteps) {
  StepMetrics m;
  m.step = 120;
  m.tokens_per_second = 2.5e6;
  m.elapsed_seconds = 10;  // 20 steps since the resume at 100: 0.5 s each; 880 left = 440 s
  EXPECT_THAT(ProgressLine(m, 1000, /*start_step=*/100), HasSubstr("2.5M tok/s | ETA 7m20s"));
  m.elapsed_seconds = 180;  // 9 s per step; 880 left = 7920 s = 2h12m
  EXPECT_THAT(ProgressLine(m, 1000, /*start_step=*/100), HasSubstr("ETA 2h12m"));
  EXPECT_THAT(ProgressLine(m, 1000, /*start_step=*/120), HasSubstr("ETA --"));
  m.step = 1000;
  EXPECT_THAT(ProgressLine(m, 1000, /*start_step=*/100), HasSubstr("ETA 0s"));
  EXPECT_THAT(ProgressLine(m, 0), StartsWith("step 1000 | loss"));
  EXPECT_THAT(ProgressLine(m, 0), Not(HasSubstr("ETA")));
}

}  // namespace
}  // namespace keel::tools
