#include "checkpoint/safetensors.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::checkpoint {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::_;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;
constexpr absl::StatusCode kInvalidArgument = absl::StatusCode::kInvalidArgument;

// A file: `n` as 8 bytes little-endian, then `header`, then `data`.
std::string FileBytes(uint64_t n, absl::string_view header, absl::string_view data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return absl::StrCat(out, header, data);
}
std::string FileBytes(absl::string_view header, absl::string_view data = "") {
  return FileBytes(header.size(), header, data);
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(file, file.size());
}

std::string TempPath(absl::string_view name) {
  static const std::string* const dir = new std::string(keel::testing::NewTempDir("safetensors"));
  return absl::StrCat(*dir, "/", name);
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> Names(const SafetensorsHeader& header) {
  std::vector<std::string> names;
  for (const SafetensorsEntry& entry : header.entries) names.push_back(entry.name);
  return names;
}

// One tensor "x", F32, shape [2], values {1, -2}. Worked out by hand:
//   JSON {"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}: {"x": is 5 bytes, {"dtype":
//   "F32", 15 (20), "shape":[2], 12 (32), "data_offsets":[0,8] 20 (52), then }} (54 bytes);
//   2 spaces pad it to N = 56 = 0x38, so the data starts at 8 + 56 = 64.
//   1.0f = 0x3f800000 and -2.0f = 0xc0000000, little-endian.
TEST(SafetensorsTest, EncodesTheHandComputedHeader) {
  std::vector<SafetensorsEntry> entries(1);
  entries[0].name = "x";
  entries[0].dtype = at::kFloat;
  entries[0].shape = {2};
  KEEL_ASSERT_OK_AND_ASSIGN(std::string header, EncodeSafetensorsHeader(entries, {}));
  const std::string expected = std::string("\x38\0\0\0\0\0\0\0", 8) +
                               R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + "  ";
  EXPECT_EQ(header, expected);
  EXPECT_EQ(entries[0].begin, 0u);
  EXPECT_EQ(entries[0].end, 8u);

  const std::string path = TempPath("hand.safetensors");
  const at::Tensor x = at::tensor({1.0f, -2.0f});
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, {{"x", x}}, {}));
  EXPECT_EQ(ReadBytes(path), expected + std::string("\0\0\x80\x3f\0\0\0\xc0", 8));
}

// The byte strings of the reference's own tests (safetensors/src/tensor.rs,
// test_serialization, test_serialization_forced_alignement, test_empty).
TEST(SafetensorsTest, MatchesTheReferenceSerializations) {
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::map<std::string, std::string> metadata;
    std::string expected_json;  // after the 8 length bytes
  };
  const std::vector<Case> cases = {
      {"attn.0",
       {1, 2, 3},
       {},
       R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})"},
      {"attn0",
       {1, 1, 2, 3},
       {},
       R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})"
       "       "},
      {"", {}, {}, "{}      "},
      {"",
       {},
       {{"framework", "pt"}},
       R"({"__metadata__":{"framework":"pt"}})"
       "     "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected_json);
    std::vector<SafetensorsEntry> entries;
    if (!c.name.empty()) {
      entries.emplace_back();
      entries.back().name = c.name;
      entries.back().shape = c.shape;
    }
    KEEL_ASSERT_OK_AND_ASSIGN(std::string header, EncodeSafetensorsHeader(entries, c.metadata));
    EXPECT_EQ(header, FileBytes(c.expected_json));
    const std::string file = header + std::string(entries.empty() ? 0 : 24, '\0');
    KEEL_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, Parse(file));
    EXPECT_EQ(parsed.data_start, header.size());
    EXPECT_EQ(parsed.metadata, c.metadata);
  }
}

TEST(SafetensorsTest, PadsTheHeaderWithSpacesSoDataStartsAtAMultipleOf8) {
  for (int length = 1; length <= 16; ++length) {
    SCOPED_TRACE(length);
    std::vector<SafetensorsEntry> entries(1);
    entries[0].name = std::string(length, 'a');
    entries[0].dtype = at::kByte;
    entries[0].shape = {3};
    KEEL_ASSERT_OK_AND_ASSIGN(std::string header, EncodeSafetensorsHeader(entries, {}));
    ASSERT_EQ(header.size() % 8, 0u);
    uint64_t n;
    std::memcpy(&n, header.data(), 8);
    EXPECT_EQ(n + 8, header.size());
    const size_t close = header.rfind('}');
    EXPECT_LT(header.size() - close - 1, 8u);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    KEEL_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed, Parse(header + "abc"));
    EXPECT_EQ(parsed.data_start % 8, 0u);
  }
}

TEST(SafetensorsTest, LaysEntriesOutInTheGivenOrder) {
  std::vector<SafetensorsEntry> entries(3);
  entries[0] = {"b", at::kDouble, {2}};
  entries[1] = {"a", at::kHalf, {0, 3}};
  entries[2] = {"c", at::kBool, {}};
  KEEL_ASSERT_OK_AND_ASSIGN(std::string header, EncodeSafetensorsHeader(entries, {{"k", "v"}}));
  EXPECT_EQ(entries[0].begin, 0u);
  EXPECT_EQ(entries[0].end, 16u);
  EXPECT_EQ(entries[1].begin, 16u);
  EXPECT_EQ(entries[1].end, 16u);
  EXPECT_EQ(entries[2].begin, 16u);
  EXPECT_EQ(entries[2].end, 17u);
  EXPECT_THAT(header, HasSubstr(R"({"__metadata__":{"k":"v"},"b":{)"));
}

// Values that distinguish elements: i * 0.75 - 2, cast to the dtype.
at::Tensor Values(at::ScalarType dtype, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  at::Tensor t = at::arange(numel, at::kDouble).mul(0.75).sub(2.0);
  if (dtype == at::kBool) t = t.gt(0);
  return t.to(dtype).reshape(shape);
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
  const std::vector<at::ScalarType> dtypes = {
      at::kBool, at::kByte,     at::kChar,  at::kShort,  at::kInt,         at::kLong,
      at::kHalf, at::kBFloat16, at::kFloat, at::kDouble, at::kComplexFloat};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {5}, {2, 0, 3}, {2, 3, 4}};
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (at::ScalarType dtype : dtypes) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      tensors.emplace_back(absl::StrCat(c10::toString(dtype), "/", i), Values(dtype, shapes[i]));
    }
  }
  const std::string path = TempPath("all.safetensors");
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9"}};
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, tensors, metadata));

  KEEL_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header, ReadSafetensorsHeader(path));
  EXPECT_EQ(header.metadata, metadata);
  EXPECT_EQ(header.data_start % 8, 0u);
  ASSERT_EQ(header.entries.size(), tensors.size());

  KEEL_ASSERT_OK_AND_ASSIGN(auto read, ReadSafetensorsFile(path));
  ASSERT_EQ(read.size(), tensors.size());
  std::map<std::string, at::Tensor> by_name(read.begin(), read.end());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_EQ(by_name.count(name), 1u);
    const at::Tensor& got = by_name[name];
    EXPECT_EQ(got.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(got.sizes(), tensor.sizes());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(at::equal(got, tensor));
  }
  // Read order is file order; here the written order except zero-byte ties, sorted by name.
  for (size_t i = 1; i < header.entries.size(); ++i) {
    EXPECT_EQ(header.entries[i].begin, header.entries[i - 1].end);
    EXPECT_EQ(read[i].first, header.entries[i].name);
  }
}

TEST(SafetensorsTest, WritesViewsAsContiguousCpuData) {
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor complex =
      at::arange(4, at::kFloat).to(at::kComplexFloat).mul(c10::complex<float>(1, 2));
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"transposed", base.t()},
      {"column", base.select(1, 2)},
      {"expanded", at::tensor({7.0f}).expand({3})},
      {"conj", complex.conj()},
      {"neg", at::imag(complex.conj())},
  };
  ASSERT_TRUE(tensors[3].second.is_conj());
  ASSERT_TRUE(tensors[4].second.is_neg());
  const std::string path = TempPath("views.safetensors");
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, tensors, {}));
  KEEL_ASSERT_OK_AND_ASSIGN(auto read, ReadSafetensorsFile(path));
  ASSERT_EQ(read.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(read[i].first, tensors[i].first);
    EXPECT_TRUE(at::equal(read[i].second, tensors[i].second.resolve_conj().resolve_neg()));
  }
}

TEST(SafetensorsTest, WriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = TempPath("replace.safetensors");
  WriteBytes(path, "old contents");
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, {{"a", at::ones({2}, at::kLong)}}, {}));
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  KEEL_ASSERT_OK_AND_ASSIGN(auto read, ReadSafetensorsFile(path));
  ASSERT_EQ(read.size(), 1u);
  EXPECT_TRUE(at::equal(read[0].second, at::ones({2}, at::kLong)));
}

TEST(SafetensorsTest, WriteRejectsBadInputs) {
  const std::string path = TempPath("bad.safetensors");
  const at::Tensor t = at::zeros({2});
  EXPECT_THAT(WriteSafetensorsFile(path, {{"u", at::Tensor()}}, {}),
              StatusIs(kInvalidArgument, HasSubstr("tensor \"u\" is undefined")));
  EXPECT_THAT(WriteSafetensorsFile(path, {{"a", t}, {"a", t}}, {}),
              StatusIs(kInvalidArgument, HasSubstr("duplicate safetensors tensor name \"a\"")));
  for (const std::string& name :
       {std::string(), std::string("__metadata__"), std::string("\xff")}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(WriteSafetensorsFile(path, {{name, t}}, {}),
                StatusIs(kInvalidArgument,
                         HasSubstr("names must be non-empty UTF-8 other than __metadata__")));
  }
  EXPECT_THAT(WriteSafetensorsFile(path, {{"c", at::zeros({2}, at::kComplexDouble)}}, {}),
              StatusIs(kInvalidArgument,
                       HasSubstr("tensor \"c\": dtype ComplexDouble has no safetensors spelling")));
  EXPECT_THAT(WriteSafetensorsFile(path, {{"a", t}}, {{"k", "\xc0\x80"}}),
              StatusIs(kInvalidArgument, HasSubstr("__metadata__ key \"k\" or its value is not")));
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  EXPECT_THAT(WriteSafetensorsFile(TempPath("missing/dir.safetensors"), {{"a", t}}, {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing/dir.safetensors.tmp")));
}

TEST(SafetensorsTest, EncodeRejectsBadShapes) {
  std::vector<SafetensorsEntry> entries(1);
  entries[0].name = "w";
  entries[0].shape = {2, -1};
  EXPECT_THAT(
      EncodeSafetensorsHeader(entries, {}),
      StatusIs(kInvalidArgument, HasSubstr("tensor \"w\" has shape [2, -1]; dims must be >= 0")));
  // 2^62 elements of 4 bytes: 2^64 bytes.
  entries[0].shape = {int64_t{1} << 31, int64_t{1} << 31};
  EXPECT_THAT(EncodeSafetensorsHeader(entries, {}),
              StatusIs(kInvalidArgument,
                       HasSubstr("tensor \"w\" has shape [2147483648, 2147483648] of F32, too "
                                 "large for LibTorch")));
  // Each tensor of 2^62 bytes is fine on its own; the second ends at 2^63, past what a file
  // (off_t) can hold.
  entries.assign(2, entries[0]);
  for (int i = 0; i < 2; ++i) {
    entries[i].name = absl::StrCat("w", i);
    entries[i].dtype = at::kByte;
    entries[i].shape = {int64_t{1} << 62};
  }
  EXPECT_THAT(
      EncodeSafetensorsHeader(entries, {}),
      StatusIs(kInvalidArgument, HasSubstr("the tensors up to \"w1\" total 9223372036854775808 "
                                           "bytes, more than a file can hold")));
}

// Every kind of block of a 3-D tensor (rows, columns, an inner block, the whole, an empty one)
// equals the same slice of the tensor, in each of two tensors of a file.
TEST(SafetensorsTest, ReadsABlockOfATensor) {
  const at::Tensor first = at::arange(4 * 5 * 6, at::kFloat).view({4, 5, 6});
  const at::Tensor second = at::arange(7 * 3, at::kBFloat16).view({7, 3}) * -1;
  const std::string path = TempPath("blocks.safetensors");
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, {{"first", first}, {"second", second}}, {}));
  KEEL_ASSERT_OK_AND_ASSIGN(const SafetensorsHeader header, ReadSafetensorsHeader(path));
  struct Case {
    std::vector<int64_t> offsets, shape;
  };
  for (const Case& c : std::vector<Case>{{{2, 0, 0}, {2, 5, 6}},
                                         {{0, 0, 3}, {4, 5, 3}},
                                         {{1, 2, 1}, {2, 3, 4}},
                                         {{0, 0, 0}, {4, 5, 6}},
                                         {{3, 4, 5}, {1, 1, 1}},
                                         {{1, 0, 0}, {0, 5, 6}}}) {
    SCOPED_TRACE(absl::StrCat(absl::StrJoin(c.offsets, ","), " ", absl::StrJoin(c.shape, ",")));
    KEEL_ASSERT_OK_AND_ASSIGN(
        const at::Tensor block,
        ReadSafetensorsBlock(path, header, header.entries[0], c.offsets, c.shape));
    at::Tensor want = first;
    for (int d = 0; d < 3; ++d) want = want.narrow(d, c.offsets[d], c.shape[d]);
    EXPECT_TRUE(at::equal(block, want));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(const at::Tensor columns,
                            ReadSafetensorsBlock(path, header, header.entries[1], {0, 1}, {7, 2}));
  EXPECT_TRUE(at::equal(columns, second.narrow(1, 1, 2)));
  EXPECT_THAT(ReadSafetensorsBlock(path, header, header.entries[1], {6, 0}, {2, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("[6, 0] of shape [2, 3]"), HasSubstr("\"second\""))));
  EXPECT_THAT(ReadSafetensorsBlock(path, header, header.entries[1], {0}, {7}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not inside")));
  WriteBytes(path, ReadBytes(path) + "x");
  EXPECT_THAT(ReadSafetensorsBlock(path, header, header.entries[1], {0, 0}, {7, 3}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("the file changed")));
}

// A block is read alone: bytes outside it are never looked at. Here the rows outside the block
// hold BOOL bytes that make the whole tensor unreadable.
TEST(SafetensorsTest, ReadsOnlyTheBytesOfTheBlock) {
  const std::string path = TempPath("bool_rows.safetensors");
  KEEL_ASSERT_OK(WriteSafetensorsFile(path, {{"flags", at::ones({4, 8}, at::kBool)}}, {}));
  KEEL_ASSERT_OK_AND_ASSIGN(const SafetensorsHeader header, ReadSafetensorsHeader(path));
  std::string bytes = ReadBytes(path);
  for (int64_t i = 0; i < 16; ++i) bytes[header.data_start + i] = 7;  // rows 0 and 1
  WriteBytes(path, bytes);
  EXPECT_THAT(ReadSafetensorsFile(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 7")));
  KEEL_ASSERT_OK_AND_ASSIGN(const at::Tensor rows,
                            ReadSafetensorsBlock(path, header, header.entries[0], {2, 0}, {2, 8}));
  EXPECT_TRUE(at::equal(rows, at::ones({2, 8}, at::kBool)));
  EXPECT_THAT(ReadSafetensorsBlock(path, header, header.entries[0], {1, 0}, {2, 8}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("byte 7")));
}

TEST(SafetensorsTest, ReadReportsMissingAndCorruptFiles) {
  const std::string missing = TempPath("no_such.safetensors");
  EXPECT_THAT(ReadSafetensorsFile(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  EXPECT_THAT(ReadSafetensorsHeader(missing), StatusIs(absl::StatusCode::kNotFound, _));

  const std::string path = TempPath("corrupt.safetensors");
  const std::string good =
      FileBytes(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\1'));
  WriteBytes(path, good.substr(0, good.size() - 1));
  EXPECT_THAT(ReadSafetensorsFile(path),
              StatusIs(kDataLoss, AllOf(StartsWith(path + ": safetensors header: "),
                                        HasSubstr("the tensors cover 8 bytes but the data buffer "
                                                  "has 7"))));
  WriteBytes(path, good.substr(0, 12));
  EXPECT_THAT(ReadSafetensorsHeader(path),
              StatusIs(kDataLoss, AllOf(HasSubstr(path), HasSubstr("runs past the end of the "
                                                                   "file"))));
  WriteBytes(path, good);
  EXPECT_THAT(ReadSafetensorsFile(path), IsOk());
}

TEST(SafetensorsTest, ReadRejectsBoolBytesOtherThan0And1) {
  const std::string path = TempPath("bool.safetensors");
  WriteBytes(path, FileBytes(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                             std::string("\1\0\2", 3)));
  EXPECT_THAT(ReadSafetensorsFile(path),
              StatusIs(kDataLoss, HasSubstr("tensor \"m\" (BOOL) has byte 2 at element 2")));
}

TEST(SafetensorsTest, ParseAcceptsWhatTheReferenceAccepts) {
  // Any entry order, unpadded header, "-0", zero-byte tensors sharing an offset.
  const std::string file =
      FileBytes(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                R"("z":{"dtype":"F64","shape":[0,-0],"data_offsets":[2,2]},)"
                R"("__metadata__":{},"a":{"dtype":"I8","shape":[2],"data_offsets":[0,2]},)"
                R"("y":{"shape":[3,0],"data_offsets":[2,2],"dtype":"C64"}})",
                "abcd");
  KEEL_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header, Parse(file));
  EXPECT_THAT(Names(header), ElementsAre("a", "y", "z", "b"));
  EXPECT_EQ(header.entries[2].dtype, at::kDouble);
  EXPECT_EQ(header.entries[2].shape, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(header.data_start, file.size() - 4);
  EXPECT_TRUE(header.metadata.empty());
}

struct BadHeader {
  std::string name;
  std::string file;
  std::string message;
};

std::string Entry(absl::string_view fields) { return absl::StrCat(R"({"w":{)", fields, "}}"); }

TEST(SafetensorsTest, ParseRejectsEveryBrokenRule) {
  const std::string f32x4 = R"("dtype":"F32","shape":[2,2])";
  const std::vector<BadHeader> cases = {
      {"short file", std::string("\x02\0\0\0", 4),
       "the file has 4 bytes, fewer than the 8 of the header length"},
      {"header too large", FileBytes(100'000'001, "{}"),
       "header length 100000001 exceeds the limit of 100000000 bytes"},
      {"header past the end", FileBytes(40, "{}      "),
       "header length 40 runs past the end of the file (8 + 40 > 16 bytes)"},
      {"empty header", FileBytes(""), "the header must start with '{', got an empty header"},
      {"leading space", FileBytes(" {}"), "the header must start with '{', got byte 0x20"},
      {"array", FileBytes("[]"), "the header must start with '{', got byte 0x5b"},
      {"syntax", FileBytes(R"({"w":})"), "not valid JSON: [json.exception.parse_error.101]"},
      {"trailing NUL", FileBytes(absl::string_view("{}\0\0", 4)),
       "not valid JSON: a NUL byte at header offset 2"},
      {"NUL in a string", FileBytes(absl::string_view("{\"\0\":{}}", 7)),
       "not valid JSON: a NUL byte at header offset 2"},
      {"trailing value", FileBytes("{} {}"), "not valid JSON"},
      {"comment", FileBytes("{} // x"), "not valid JSON"},
      {"bad UTF-8", FileBytes("{\"\xff\":1}"), "not valid JSON"},
      {"duplicate tensor",
       FileBytes(R"({"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]},)"
                 R"("w":{"dtype":"U8","shape":[],"data_offsets":[1,2]}})",
                 "ab"),
       "duplicate key \"w\""},
      {"duplicate escaped",
       FileBytes(R"({"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"\u0077":{}})", "a"),
       "duplicate key \"w\""},
      {"duplicate field",
       FileBytes(Entry(R"("dtype":"U8","shape":[],"data_offsets":[0,1],"dtype":"I8")"), "a"),
       "\"w\" has a duplicate key \"dtype\""},
      {"duplicate metadata key", FileBytes(R"({"__metadata__":{"k":"1","k":"2"}})"),
       "\"__metadata__\" has a duplicate key \"k\""},
      {"duplicate metadata", FileBytes(R"({"__metadata__":{},"__metadata__":{}})"),
       "duplicate key \"__metadata__\""},
      {"entry not an object", FileBytes(R"({"w":[0,4]})"),
       "tensor \"w\" must be an object with dtype, shape and data_offsets, got [0,4]"},
      {"entry scalar", FileBytes(R"({"w":null})"), "tensor \"w\" must be an object"},
      {"missing dtype", FileBytes(Entry(R"("shape":[],"data_offsets":[0,4])")),
       "tensor \"w\" has no \"dtype\""},
      {"missing shape", FileBytes(Entry(R"("dtype":"F32","data_offsets":[0,4])")),
       "tensor \"w\" has no \"shape\""},
      {"missing offsets", FileBytes(Entry(R"("dtype":"F32","shape":[])")),
       "tensor \"w\" has no \"data_offsets\""},
      {"unknown field", FileBytes(Entry(f32x4 + R"(,"data_offsets":[0,16],"x":1)")),
       "tensor \"w\" has an unknown field \"x\"; allowed: dtype, shape, data_offsets"},
      {"dtype not a string", FileBytes(Entry(R"("dtype":4,"shape":[],"data_offsets":[0,4])")),
       "tensor \"w\" has dtype 4, not a string"},
      {"unknown dtype", FileBytes(Entry(R"("dtype":"f32","shape":[],"data_offsets":[0,4])")),
       "tensor \"w\": unknown dtype \"f32\"; supported: BOOL (Bool)"},
      {"dtype without LibTorch",
       FileBytes(Entry(R"("dtype":"F4","shape":[2],"data_offsets":[0,1])")),
       "tensor \"w\": dtype \"F4\" has no LibTorch equivalent"},
      {"shape not an array", FileBytes(Entry(R"("dtype":"F32","shape":4,"data_offsets":[0,16])")),
       "tensor \"w\" has shape 4, not an array of non-negative integers"},
      {"negative dim", FileBytes(Entry(R"("dtype":"F32","shape":[2,-1],"data_offsets":[0,0])")),
       "tensor \"w\" has shape [2,-1]; dims must be non-negative integers, got -1"},
      {"float dim", FileBytes(Entry(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])")),
       "tensor \"w\" has shape [2.0]; dims must be non-negative integers, got 2.0"},
      {"string dim", FileBytes(Entry(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])")),
       "dims must be non-negative integers, got \"2\""},
      {"dim past int64",
       FileBytes(Entry(R"("dtype":"F32","shape":[9223372036854775808,0],"data_offsets":[0,0])")),
       "with dim 9223372036854775808 > 2^63 - 1, too large for LibTorch"},
      {"dim past uint64",
       FileBytes(Entry(R"("dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,0])")),
       "dims must be non-negative integers, got 1.8446744073709552e+19"},
      {"nested shape", FileBytes(Entry(R"("dtype":"F32","shape":[[2]],"data_offsets":[0,8])")),
       "\"w\" nests arrays or objects deeper than the format's"},
      {"offsets not an array", FileBytes(Entry(f32x4 + R"(,"data_offsets":16)")),
       "tensor \"w\" has data_offsets 16; expected [BEGIN, END], two non-negative integers"},
      {"one offset", FileBytes(Entry(f32x4 + R"(,"data_offsets":[16])")),
       "tensor \"w\" has data_offsets [16]; expected [BEGIN, END]"},
      {"three offsets", FileBytes(Entry(f32x4 + R"(,"data_offsets":[0,16,16])")),
       "tensor \"w\" has data_offsets [0,16,16]; expected [BEGIN, END]"},
      {"negative offset", FileBytes(Entry(f32x4 + R"(,"data_offsets":[-16,0])")),
       "tensor \"w\" has data_offsets [-16,0]; expected [BEGIN, END]"},
      {"END < BEGIN", FileBytes(Entry(f32x4 + R"(,"data_offsets":[16,0])")),
       "tensor \"w\" has data_offsets [16, 0] with END < BEGIN"},
      {"size mismatch", FileBytes(Entry(f32x4 + R"(,"data_offsets":[0,12])"), "0123456789ab"),
       "tensor \"w\" has data_offsets [0, 12] but shape [2, 2] of F32 needs 16 bytes"},
      {"size overflow",
       FileBytes(Entry(R"("dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0])")),
       "tensor \"w\" has shape [4294967296, 4294967296] of F64, too large for LibTorch"},
      {"stride overflow",
       FileBytes(Entry(R"("dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0])")),
       "tensor \"w\" has shape [0, 4294967296, 4294967296] of U8, too large for LibTorch"},
      {"bytes overflow",
       FileBytes(Entry(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0])")),
       "of F64, too large for LibTorch"},
      {"first not at 0",
       FileBytes(Entry(f32x4 + R"(,"data_offsets":[4,20])"), std::string(20, 'x')),
       "tensor \"w\" has data_offsets [4, 20]; the first tensor must begin at 0"},
      {"hole",
       FileBytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                 "abcde"),
       "tensor \"b\" has data_offsets [3, 5], leaving a hole after tensor \"a\", which ends at 2"},
      {"overlap",
       FileBytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                 "abc"),
       "tensor \"b\" has data_offsets [1, 3], overlapping tensor \"a\", which ends at 2"},
      {"same range",
       FileBytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})",
                 "ab"),
       "tensor \"b\" has data_offsets [0, 2], overlapping tensor \"a\", which ends at 2"},
      {"extra data", FileBytes(Entry(f32x4 + R"(,"data_offsets":[0,16])"), std::string(17, 'x')),
       "the tensors cover 16 bytes but the data buffer has 17"},
      {"truncated data",
       FileBytes(Entry(f32x4 + R"(,"data_offsets":[0,16])"), std::string(15, 'x')),
       "the tensors cover 16 bytes but the data buffer has 15"},
      {"data without tensors", FileBytes("{}", "x"),
       "the tensors cover 0 bytes but the data buffer has 1"},
      {"metadata not an object", FileBytes(R"({"__metadata__":["a"]})"),
       "__metadata__ must be an object of strings, got [\"a\"]"},
      {"metadata value not a string", FileBytes(R"({"__metadata__":{"k":1}})"),
       "__metadata__ value of \"k\" must be a string, got 1"},
      {"metadata value nested", FileBytes(R"({"__metadata__":{"k":{"a":"b"}}})"),
       "__metadata__ value of \"k\" must be a string, got {\"a\":\"b\"}"},
      {"deep nesting", FileBytes(absl::StrCat(R"({"w":)", std::string(5000, '['))),
       "\"w\" nests arrays or objects deeper"},
  };
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(Parse(c.file), StatusIs(kDataLoss, AllOf(StartsWith("safetensors header: "),
                                                         HasSubstr(c.message))));
  }
}

TEST(SafetensorsTest, ParseRequiresTheHeaderBytes) {
  const std::string file = FileBytes("{}      ");
  EXPECT_THAT(ParseSafetensorsHeader(file.substr(0, 4), file.size()),
              StatusIs(kInvalidArgument, HasSubstr("needs the first 8 bytes, got 4")));
  EXPECT_THAT(ParseSafetensorsHeader(file.substr(0, 10), file.size()),
              StatusIs(kInvalidArgument, HasSubstr("needs the first 16 bytes, got 10")));
  EXPECT_THAT(ParseSafetensorsHeader(file, file.size()), IsOk());
  EXPECT_THAT(ParseSafetensorsHeader(file + "trailing bytes are not read", file.size()), IsOk());
  EXPECT_THAT(ParseSafetensorsHeader(file, file.size() + 1),
              StatusIs(kDataLoss, HasSubstr("the data buffer has 1")));
}

}  // namespace
}  // namespace keel::checkpoint
