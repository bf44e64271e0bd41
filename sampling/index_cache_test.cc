// Tests of the index cache's building blocks: MD5, Python's json.dumps, and .npy files.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/internal/index_array.h"
#include "sampling/internal/md5.h"
#include "sampling/internal/python_json.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling::internal {
namespace {

using ::absl::StatusCode;
using ::keel::base::Json;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::keel::testing::WriteFileOrFail;
using ::testing::HasSubstr;

TEST(Md5Test, MatchesRfc1321TestSuite) {
  EXPECT_EQ(Md5Hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(Md5Hex("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(Md5Hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(Md5Hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(Md5Hex("abcdefghijklmnopqrstuvwxyz"), "c3fcd3d76192e4007dfb496cca67e13b");
  EXPECT_EQ(Md5Hex("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "d174ab98d277d9f5a5611c2c9f419d9f");
  std::string eighty;
  for (int i = 0; i < 8; ++i) eighty += "1234567890";
  EXPECT_EQ(Md5Hex(eighty), "57edf4a22be3c955ac49da2e2107b67a");
}

// The expected text and digest are what Python 3.11 prints for the same object:
//   t = json.dumps(d, indent=4); print(t); print(hashlib.md5(t.encode("utf-8")).hexdigest())
TEST(PythonJsonTest, DumpsAsPythonWithIndentFour) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Json d = Json::object();
  d["class"] = "GPTDataset";
  d["dataset_path"] = "/tmp/x/a\xc3\xa9\xf0\x9f\x98\x80\"q\\\n";
  d["num_samples"] = nullptr;
  d["index_split"] = "train";
  d["random_seed"] = 1234;
  d["split"] = "900,50,50";
  // Megatron's split matrix for "900,50,50": bookends summed in order from the integer 0.
  d["split_matrix"] = {{0, 0.9}, {0.9, 0.9 + 0.05}, {0.9 + 0.05, 0.9 + 0.05 + 0.05}};
  d["tokenizer"] = {{"class", "keel"}, {"ids", Json::array()}, {"m", Json::object()}};
  d["floats"] = {1e16,    1e15, 0.0001, 0.00001, -0.0,      123.456,
                 1.5e-07, nan,  inf,    2.5e+20, 0.1 + 0.2, 5e-324};
  d["flags"] = {true, false};
  const std::string expected = R"({
    "class": "GPTDataset",
    "dataset_path": "/tmp/x/a\u00e9\ud83d\ude00\"q\\\n",
    "num_samples": null,
    "index_split": "train",
    "random_seed": 1234,
    "split": "900,50,50",
    "split_matrix": [
        [
            0,
            0.9
        ],
        [
            0.9,
            0.9500000000000001
        ],
        [
            0.9500000000000001,
            1.0
        ]
    ],
    "tokenizer": {
        "class": "keel",
        "ids": [],
        "m": {}
    },
    "floats": [
        1e+16,
        1000000000000000.0,
        0.0001,
        1e-05,
        -0.0,
        123.456,
        1.5e-07,
        NaN,
        Infinity,
        2.5e+20,
        0.30000000000000004,
        5e-324
    ],
    "flags": [
        true,
        false
    ]
})";
  const std::string text = PythonJsonDumps(d);
  EXPECT_EQ(text, expected);
  EXPECT_EQ(Md5Hex(text), "d7631c34f60ec4e6750e17c3c25d1db3");
}

TEST(PythonJsonTest, InvalidUtf8BytesAreSurrogateEscaped) {
  // os.fsdecode(b"a\xff") == "a\udcff"; json.dumps gives "a\\udcff".
  EXPECT_EQ(PythonJsonDumps(Json(std::string("a\xff"))), "\"a\\udcff\"");
}

// numpy.save(f, numpy.arange(3, dtype=numpy.int32)) writes 128 header bytes: the magic,
// version 1.0, length 0x76, the dict, spaces to column 127 and '\n'.
TEST(NpyTest, HeaderIsNumpySaves) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
  std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict;
  expected.append(127 - expected.size(), ' ');
  expected += '\n';
  EXPECT_EQ(NpyHeader(IndexDtype::kInt32, {3}), expected);
  // (75, 2) int64: also 128 bytes.
  const std::string dict2 = "{'descr': '<i8', 'fortran_order': False, 'shape': (75, 2), }";
  EXPECT_EQ(NpyHeader(IndexDtype::kInt64, {75, 2}).substr(10, dict2.size()), dict2);
  EXPECT_EQ(NpyHeader(IndexDtype::kInt64, {75, 2}).size(), 128u);
}

TEST(NpyTest, CreatedFileReadsBack) {
  const std::string path = NewTempDir("npy") + "/a.npy";
  KEEL_ASSERT_OK_AND_ASSIGN(IndexArray created,
                            IndexArray::CreateNpy(path, IndexDtype::kUint32, {5, 2}));
  for (int i = 0; i < 10; ++i) created.data<uint32_t>()[i] = 4000000000u + i;
  KEEL_ASSERT_OK(created.Sync());
  KEEL_ASSERT_OK_AND_ASSIGN(IndexArray opened, IndexArray::OpenNpy(path));
  EXPECT_EQ(opened.dtype(), IndexDtype::kUint32);
  EXPECT_EQ(opened.shape(), (std::vector<int64_t>{5, 2}));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(opened.Get(i), 4000000000 + i);
}

TEST(NpyTest, RejectsFilesThatAreNotIndexArrays) {
  const std::string dir = NewTempDir("npy_bad");
  EXPECT_THAT(IndexArray::OpenNpy(dir + "/missing.npy"),
              StatusIs(StatusCode::kNotFound, HasSubstr("missing.npy")));
  WriteFileOrFail(dir + "/text.npy", "hello, world");
  EXPECT_THAT(IndexArray::OpenNpy(dir + "/text.npy"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("no .npy magic")));
  KEEL_ASSERT_OK_AND_ASSIGN(IndexArray created,
                            IndexArray::CreateNpy(dir + "/short.npy", IndexDtype::kInt64, {4}));
  KEEL_ASSERT_OK(created.Sync());
  std::string bytes = ReadFileOrFail(dir + "/short.npy");
  WriteFileOrFail(dir + "/short.npy", bytes.substr(0, bytes.size() - 8));
  EXPECT_THAT(IndexArray::OpenNpy(dir + "/short.npy"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("24 data bytes for shape (4,)")));
  std::string fortran = bytes;
  fortran.replace(fortran.find("False"), 5, "True ");
  WriteFileOrFail(dir + "/fortran.npy", fortran);
  EXPECT_THAT(IndexArray::OpenNpy(dir + "/fortran.npy"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("Fortran order")));
  std::string floats = bytes;
  floats.replace(floats.find("<i8"), 3, "<f8");
  WriteFileOrFail(dir + "/floats.npy", floats);
  EXPECT_THAT(IndexArray::OpenNpy(dir + "/floats.npy"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("dtype '<f8'")));
}

}  // namespace
}  // namespace keel::sampling::internal
