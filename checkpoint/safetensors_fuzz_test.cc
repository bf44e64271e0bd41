// Fuzzes the safetensors header parser (ParseSafetensorsHeader): an input is a whole file. The
// parser must return kDataLoss or a header whose every promise holds, including that
// EncodeSafetensorsHeader writes it back to a file that parses to the same header; a broken
// promise traps.
//
// Built by Bazel with gcc, this file is a test that runs the entry point over a generated
// corpus (encoded headers, all their truncations, byte mutations and random bytes). To fuzz
// with libFuzzer (Debian: clang, libclang-rt-14-dev), from the repository root:
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -DKEEL_LIBFUZZER -I.
//       checkpoint/safetensors_fuzz_test.cc checkpoint/safetensors.cc checkpoint/internal/dtype.cc
//       -ltorch -ltorch_cpu -lc10 -labsl_statusor -labsl_status -labsl_strings -labsl_int128
//       -labsl_throw_delegate -labsl_raw_logging_internal -labsl_str_format_internal
//       -labsl_cord -labsl_cordz_info -labsl_cord_internal -o /tmp/safetensors_fuzzer
//   mkdir -p /tmp/safetensors_corpus
//   ASAN_OPTIONS=detect_leaks=0 /tmp/safetensors_fuzzer -max_total_time=60 /tmp/safetensors_corpus
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/safetensors.h"

namespace keel::checkpoint {
namespace {

void Require(bool promise) {
  if (!promise) __builtin_trap();
}

bool SameEntries(const std::vector<SafetensorsEntry>& a, const std::vector<SafetensorsEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tie(a[i].name, a[i].dtype, a[i].shape, a[i].begin, a[i].end) !=
        std::tie(b[i].name, b[i].dtype, b[i].shape, b[i].begin, b[i].end)) {
      return false;
    }
  }
  return true;
}

// Checks every promise of a header that ParseSafetensorsHeader accepted from `file`.
void CheckHeader(const SafetensorsHeader& header, absl::string_view file) {
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  Require(n <= kMaxSafetensorsHeaderSize && header.data_start == 8 + n);
  Require(header.data_start <= file.size() && file[8] == '{');

  std::set<std::string> names;
  uint64_t covered = 0;
  bool any_empty_name = false;
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const SafetensorsEntry& entry = header.entries[i];
    Require(entry.name != "__metadata__" && names.insert(entry.name).second);
    any_empty_name |= entry.name.empty();
    if (i > 0) {
      const SafetensorsEntry& previous = header.entries[i - 1];
      Require(std::tie(previous.begin, previous.end, previous.name) <
              std::tie(entry.begin, entry.end, entry.name));
    }
    Require(entry.begin == covered && entry.begin <= entry.end);
    // The dtype has a spelling that reads back as itself.
    absl::StatusOr<std::string> dtype = internal::DtypeName(entry.dtype);
    Require(dtype.ok());
    absl::StatusOr<at::ScalarType> parsed = internal::ParseDtype(*dtype);
    Require(parsed.ok() && *parsed == entry.dtype);
    // Sizes in 128 bits: LibTorch can allocate the shape and the byte range matches it.
    unsigned __int128 bound = 1;
    unsigned __int128 numel = 1;
    for (const int64_t dim : entry.shape) {
      Require(dim >= 0);
      bound *= static_cast<unsigned __int128>(dim > 0 ? dim : 1);
      Require(bound <= static_cast<unsigned __int128>(INT64_MAX));
      numel *= static_cast<unsigned __int128>(dim);
    }
    Require(numel * c10::elementSize(entry.dtype) == entry.end - entry.begin);
    covered = entry.end;
  }
  Require(covered == file.size() - header.data_start);

  // Written back in file order, the header lays the entries out at the same offsets and reads
  // back the same. Only an empty name (which readers accept and Keel does not write) stops it.
  std::vector<SafetensorsEntry> entries = header.entries;
  absl::StatusOr<std::string> encoded = EncodeSafetensorsHeader(entries, header.metadata);
  if (any_empty_name) {
    Require(encoded.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  if (!encoded.ok() && n > kMaxSafetensorsHeaderSize - 1024) return;  // may not fit any more
  Require(encoded.ok() && encoded->size() % 8 == 0 && SameEntries(entries, header.entries));
  const std::string rewritten = *encoded + std::string(covered, '\0');
  absl::StatusOr<SafetensorsHeader> reparsed = ParseSafetensorsHeader(rewritten, rewritten.size());
  Require(reparsed.ok() && reparsed->data_start == encoded->size());
  Require(SameEntries(reparsed->entries, header.entries) && reparsed->metadata == header.metadata);
}

}  // namespace
}  // namespace keel::checkpoint

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<keel::checkpoint::SafetensorsHeader> header =
      keel::checkpoint::ParseSafetensorsHeader(file, file.size());
  if (header.ok()) {
    keel::checkpoint::CheckHeader(*header, file);
  } else if (header.status().code() != absl::StatusCode::kDataLoss) {
    __builtin_trap();
  }
  return 0;
}

#ifndef KEEL_LIBFUZZER
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::checkpoint {
namespace {

// A valid file: the encoded header of `entries`, then their bytes (a counting pattern).
std::string ValidFile(std::vector<SafetensorsEntry> entries,
                      const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, metadata);
  EXPECT_TRUE(header.ok()) << header.status();
  std::string file = header.value_or("");
  const uint64_t data = entries.empty() ? 0 : entries.back().end;
  for (uint64_t i = 0; i < data; ++i) file.push_back(static_cast<char>(i));
  return file;
}

// A file with a header written by hand (no padding, any order).
std::string HandFile(absl::string_view json, absl::string_view data) {
  std::string file(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(file.data(), &n, 8);
  return absl::StrCat(file, json, data);
}

struct Tally {
  int accepted = 0;
  int rejected = 0;
};

void RunInput(const std::string& input, Tally& tally) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  ++(ParseSafetensorsHeader(input, input.size()).ok() ? tally.accepted : tally.rejected);
}

TEST(SafetensorsFuzzTest, SurvivesTheCorpus) {
  const std::vector<std::string> seeds = {
      ValidFile({{"x", at::kFloat, {2}}}, {}),
      ValidFile({{"w", at::kBFloat16, {2, 3}},
                 {"b", at::kBool, {}},
                 {"e", at::kLong, {0, 4}},
                 {"c", at::kComplexFloat, {1}}},
                {{"format", "pt"}, {"k\xc3\xa9y", "v\n"}}),
      ValidFile({}, {}),
      ValidFile({}, {{"a", ""}}),
      ValidFile({{"\x01\"\\", at::kChar, {3}}, {"u\xe2\x82\xac", at::kShort, {1, 1}}}, {}),
      HandFile(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
               R"("a":{"shape":[-0],"dtype":"I8","data_offsets":[0,0]},)"
               R"("":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})",
               "abcd"),
      HandFile(R"({"__metadata__":{"x":"y"},"\u0077":{"dtype":"F16","shape":[1],)"
               R"("data_offsets":[0,2]}}   )",
               "zz"),
  };
  Tally tally;
  std::mt19937_64 random(20240611);
  for (const std::string& seed : seeds) {
    RunInput(seed, tally);
    for (size_t size = 0; size < seed.size(); ++size) RunInput(seed.substr(0, size), tally);
    for (size_t at = 0; at < seed.size(); ++at) {
      for (uint8_t value : {0x00, 0x01, 0x20, 0x30, 0x7f, 0x80, 0xff}) {
        std::string mutated = seed;
        mutated[at] = static_cast<char>(value);
        RunInput(mutated, tally);
        mutated[at] = static_cast<char>(seed[at] ^ value);
        RunInput(mutated, tally);
      }
    }
    for (int i = 0; i < 300; ++i) {
      std::string mutated = seed;
      mutated[8 + random() % (mutated.size() - 8)] = "0123456789[]{},:\"-"[random() % 18];
      mutated.append(random() % 3 == 0 ? random() % 16 : 0, static_cast<char>(random()));
      RunInput(mutated, tally);
    }
  }
  for (int i = 0; i < 500; ++i) {
    std::string noise(random() % 200, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    if (noise.size() > 8 && random() % 2 == 0) {
      const uint64_t n = noise.size() - 8 - random() % 4;
      std::memcpy(noise.data(), &n, 8);
      noise[8] = '{';
    }
    RunInput(noise, tally);
  }
  // The corpus reaches both outcomes; each accepted header passed CheckHeader.
  EXPECT_GT(tally.accepted, 100);
  EXPECT_GT(tally.rejected, 5000);
}

}  // namespace
}  // namespace keel::checkpoint
#endif  // KEEL_LIBFUZZER
