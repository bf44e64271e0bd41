// Fuzzes the index parser (internal::ParseIndex): an input is 8 bytes of .bin size
// (little-endian), 1 flag byte (bit 0: multimodal), then the .idx bytes. The parser must
// return an error or a layout whose every promise holds; a broken promise traps.
//
// Built by Bazel with gcc, this file is a test that runs the entry point over a generated
// corpus (valid indices, all their truncations, byte mutations and random bytes). To fuzz
// with libFuzzer (Debian: clang, libclang-rt-14-dev), from the repository root:
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -DKEEL_LIBFUZZER -I.
//       sampling/index_format_fuzz_test.cc sampling/internal/index_format.cc
//       -labsl_statusor -labsl_status -labsl_strings -labsl_int128 -labsl_throw_delegate
//       -labsl_raw_logging_internal -o /tmp/index_fuzzer
//   mkdir -p /tmp/index_corpus && /tmp/index_fuzzer -max_total_time=60 /tmp/index_corpus
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sampling/internal/index_format.h"

namespace keel::sampling::internal {
namespace {

void Require(bool promise) {
  if (!promise) __builtin_trap();
}

// Checks every promise of a layout that ParseIndex accepted.
void CheckLayout(const IndexLayout& layout, absl::Span<const uint8_t> index, uint64_t bin_size,
                 bool multimodal) {
  const uint8_t* begin = index.data();
  const uint8_t* end = begin + index.size();
  Require(layout.item_size == ItemSizeOfCode(layout.dtype_code) && layout.item_size > 0);
  Require(layout.sequence_count >= 0 && layout.document_count >= 1);
  Require(layout.lengths == begin + kIndexHeaderSize);
  Require(layout.documents + 8 * layout.document_count + (multimodal ? layout.sequence_count : 0) ==
          end);
  Require((layout.modes != nullptr) == multimodal);
  Require(Load<int64_t>(layout.documents) == 0);
  Require(Load<int64_t>(layout.documents + 8 * (layout.document_count - 1)) ==
          layout.sequence_count);
  int64_t tokens = 0;
  int64_t previous_end = 0;
  for (int64_t i = 0; i < layout.sequence_count; ++i) {
    const int64_t length = Load<int32_t>(layout.lengths + 4 * i);
    const int64_t pointer = Load<int64_t>(layout.pointers + 8 * i);
    Require(length >= 0 && pointer >= previous_end && pointer % layout.item_size == 0);
    previous_end = pointer + length * layout.item_size;
    Require(static_cast<uint64_t>(previous_end) <= bin_size);
    tokens += length;
  }
  Require(tokens == layout.num_tokens);
}

}  // namespace
}  // namespace keel::sampling::internal

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace internal = keel::sampling::internal;
  if (size < 9) return 0;
  uint64_t bin_size;
  std::memcpy(&bin_size, data, 8);
  const bool multimodal = (data[8] & 1) != 0;
  const absl::Span<const uint8_t> index(data + 9, size - 9);
  absl::StatusOr<internal::IndexLayout> layout = internal::ParseIndex(index, bin_size, multimodal);
  if (layout.ok()) {
    internal::CheckLayout(*layout, index, bin_size, multimodal);
  } else if (layout.status().code() != absl::StatusCode::kDataLoss) {
    __builtin_trap();
  }
  return 0;
}

#ifndef KEEL_LIBFUZZER
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::sampling::internal {
namespace {

// A fuzz input: .bin size, flags, then a valid index for the given sequence lengths.
std::string ValidInput(uint8_t dtype_code, const std::vector<int32_t>& lengths,
                       const std::vector<int64_t>& documents, bool multimodal) {
  const int64_t item_size = ItemSizeOfCode(dtype_code);
  std::vector<int64_t> pointers;
  int64_t pointer = 0;
  for (const int32_t length : lengths) {
    pointers.push_back(pointer);
    pointer += length * item_size;
  }
  const std::vector<int8_t> modes(multimodal ? lengths.size() : 0, 1);
  std::string input(8, '\0');
  const uint64_t bin_size = static_cast<uint64_t>(pointer);
  std::memcpy(&input[0], &bin_size, 8);
  input.push_back(multimodal ? '\1' : '\0');
  return input + SerializeIndex(dtype_code, lengths, pointers, documents, modes);
}

struct Tally {
  int accepted = 0;
  int rejected = 0;
};

void RunInput(const std::string& input, Tally& tally) {
  const auto* data = reinterpret_cast<const uint8_t*>(input.data());
  LLVMFuzzerTestOneInput(data, input.size());
  if (input.size() < 9) return;
  uint64_t bin_size;
  std::memcpy(&bin_size, data, 8);
  const bool ok = ParseIndex(absl::Span<const uint8_t>(data + 9, input.size() - 9), bin_size,
                             (data[8] & 1) != 0)
                      .ok();
  ++(ok ? tally.accepted : tally.rejected);
}

TEST(IndexFormatFuzzTest, SurvivesTheCorpus) {
  const std::vector<std::string> seeds = {
      ValidInput(8, {3, 1, 2, 0}, {0, 2, 4}, /*multimodal=*/false),
      ValidInput(4, {5}, {0, 1}, /*multimodal=*/true),
      ValidInput(1, {}, {0}, /*multimodal=*/false),
      ValidInput(5, {2, 2, 2}, {0, 0, 3, 3}, /*multimodal=*/false),
  };
  Tally tally;
  std::mt19937_64 random(20240611);
  for (const std::string& seed : seeds) {
    RunInput(seed, tally);
    for (size_t size = 0; size < seed.size(); ++size) RunInput(seed.substr(0, size), tally);
    for (size_t at = 0; at < seed.size(); ++at) {
      for (uint8_t value : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
        std::string mutated = seed;
        mutated[at] = static_cast<char>(value);
        RunInput(mutated, tally);
        mutated[at] = static_cast<char>(seed[at] ^ value);
        RunInput(mutated, tally);
      }
    }
    for (int i = 0; i < 200; ++i) {
      std::string mutated = seed;
      mutated[random() % mutated.size()] = static_cast<char>(random());
      mutated.append(random() % 3 == 0 ? random() % 16 : 0, static_cast<char>(random()));
      RunInput(mutated, tally);
    }
  }
  for (int i = 0; i < 500; ++i) {
    std::string noise(random() % 200, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    RunInput(noise, tally);
  }
  // The corpus reaches both outcomes; each accepted layout passed CheckLayout.
  EXPECT_GT(tally.accepted, 20);
  EXPECT_GT(tally.rejected, 1000);
}

}  // namespace
}  // namespace keel::sampling::internal
#endif  // KEEL_LIBFUZZER
