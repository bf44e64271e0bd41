#include "sampling/fixed_window_dataset.h"

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempPrefix(const std::string& name) {
  static const std::string* const dir = new std::string(keel::testing::NewTempDir("datasets"));
  return absl::StrCat(*dir, "/", name);
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  EXPECT_EQ(t.scalar_type(), at::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Writes one document per entry of `lengths`, one sequence each; token k of the whole
// stream is `first + k`.
IndexedDataset Write(const std::string& name, TokenDtype dtype, const std::vector<int>& lengths,
                     int64_t first = 0) {
  const std::string prefix = TempPrefix(name);
  auto writer = IndexedDatasetWriter::Create(prefix, dtype);
  EXPECT_TRUE(writer.ok());
  int64_t token = first;
  for (int length : lengths) {
    std::vector<int64_t> tokens;
    for (int i = 0; i < length; ++i) tokens.push_back(token++);
    EXPECT_TRUE(writer->AddItem(tokens).ok());
    writer->EndDocument();
  }
  EXPECT_TRUE(writer->Finalize().ok());
  auto dataset = IndexedDataset::Open(prefix);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return *std::move(dataset);
}

// Megatron's construction, re-done from its algorithm as an oracle: build_sample_idx
// (helpers.cpp) walks the documents to record where each sample starts (document, offset),
// and _query_document_sample_shuffle_indices concatenates the pieces between two starts plus
// the extra token.
std::vector<std::vector<int64_t>> MegatronSamples(const std::vector<std::vector<int64_t>>& docs,
                                                  int64_t seq_length, int64_t extra) {
  int64_t tokens_per_epoch = 0;
  for (const auto& d : docs) tokens_per_epoch += static_cast<int64_t>(d.size());
  const int64_t num_samples = (tokens_per_epoch - extra) / seq_length;
  std::vector<std::pair<int64_t, int64_t>> starts = {{0, 0}};
  int64_t doc = 0;
  int64_t offset = 0;
  while (static_cast<int64_t>(starts.size()) <= num_samples) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t doc_length = static_cast<int64_t>(docs[doc].size()) - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += remaining + doc_length - extra;
        remaining = 0;
      } else {
        if (doc == static_cast<int64_t>(docs.size()) - 1) {
          offset = static_cast<int64_t>(docs[doc].size()) - extra;
          break;
        }
        ++doc;
        offset = 0;
      }
    }
    starts.push_back({doc, offset});
  }
  std::vector<std::vector<int64_t>> samples;
  for (int64_t i = 0; i < num_samples; ++i) {
    const auto [doc_begin, offset_begin] = starts[i];
    const auto [doc_end, offset_end] = starts[i + 1];
    std::vector<int64_t> sample;
    for (int64_t d = doc_begin; d <= doc_end; ++d) {
      const int64_t from = d == doc_begin ? offset_begin : 0;
      const int64_t to = d == doc_end ? offset_end + extra : static_cast<int64_t>(docs[d].size());
      sample.insert(sample.end(), docs[d].begin() + from, docs[d].begin() + to);
    }
    samples.push_back(sample);
  }
  return samples;
}

TEST(GptDatasetTest, CutsWindowsAcrossDocuments) {
  // Stream 0..11 over documents of 5, 3 and 4 tokens; L = 4: (12 - 1) / 4 = 2 samples of 5.
  IndexedDataset tokens = Write("windows", TokenDtype::kUint16, {5, 3, 4});
  FixedWindowDatasetOptions options;
  options.sequence_length = 4;
  KEEL_ASSERT_OK_AND_ASSIGN(FixedWindowDataset gpt, FixedWindowDataset::Create(tokens, options));
  EXPECT_EQ(gpt.size(), 2);
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor first, gpt.Sample(0));
  EXPECT_THAT(ToVector(first), ElementsAre(0, 1, 2, 3, 4));
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor second, gpt.Sample(1));
  EXPECT_THAT(ToVector(second), ElementsAre(4, 5, 6, 7, 8));  // shares token 4 with the first
  EXPECT_THAT(gpt.Sample(2), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("sample index 2")));
  EXPECT_THAT(gpt.Sample(-1), StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("-1")));
}

TEST(GptDatasetTest, WithoutTheExtraTokenWindowsDoNotOverlap) {
  IndexedDataset tokens = Write("no_extra", TokenDtype::kInt32, {5, 3, 4});
  FixedWindowDatasetOptions options;
  options.sequence_length = 4;
  options.add_extra_token_to_sequence = false;
  KEEL_ASSERT_OK_AND_ASSIGN(FixedWindowDataset gpt, FixedWindowDataset::Create(tokens, options));
  EXPECT_EQ(gpt.size(), 3);
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor last, gpt.Sample(2));
  EXPECT_THAT(ToVector(last), ElementsAre(8, 9, 10, 11));
}

TEST(GptDatasetTest, MatchesMegatronsSampleIndex) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<int> lengths(1 + random() % 12);
    for (int& length : lengths) length = random() % 4 == 0 ? 0 : 1 + random() % 20;
    lengths.back() = 1 + random() % 20;  // Megatron cannot end on an empty document
    std::vector<std::vector<int64_t>> docs;
    int64_t token = 1000;
    for (int length : lengths) {
      docs.emplace_back();
      for (int i = 0; i < length; ++i) docs.back().push_back(token++);
    }
    const int64_t total = token - 1000;
    if (total < 2) continue;
    const TokenDtype dtype = trial % 2 == 0 ? TokenDtype::kUint16 : TokenDtype::kInt64;
    IndexedDataset tokens = Write(absl::StrCat("oracle_", trial), dtype, lengths, 1000);
    for (int64_t extra : {0, 1}) {
      FixedWindowDatasetOptions options;
      options.sequence_length = 2 + random() % 9;
      options.add_extra_token_to_sequence = extra == 1;
      SCOPED_TRACE(absl::StrCat("trial ", trial, " L=", options.sequence_length, " extra=", extra));
      KEEL_ASSERT_OK_AND_ASSIGN(FixedWindowDataset gpt,
                                FixedWindowDataset::Create(tokens, options));
      const auto expected = MegatronSamples(docs, options.sequence_length, extra);
      ASSERT_EQ(gpt.size(), static_cast<int64_t>(expected.size()));
      for (int64_t i = 0; i < gpt.size(); ++i) {
        KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor sample, gpt.Sample(i));
        EXPECT_EQ(ToVector(sample), expected[i]) << "sample " << i;
      }
    }
  }
}

TEST(GptDatasetTest, ReadsDatasetsWithGapsBetweenSequences) {
  // Sequences [0, 1, 2], [], [3, 4] stored with gaps in the .bin (int32 tokens).
  const std::string prefix = TempPrefix("gaps");
  {
    auto writer = IndexedDatasetWriter::Create(prefix, TokenDtype::kInt32);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(writer->AddItem({0, 1, 2, -1, 3, 4}).ok());  // rewritten below
    writer->EndDocument();
    ASSERT_TRUE(writer->Finalize().ok());
  }
  // The index describes three sequences: at byte 0 (3 tokens), 12 (0) and 16 (2).
  std::string index("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { index.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(uint8_t{4});
  put(uint64_t{3});
  put(uint64_t{2});
  for (int32_t length : {3, 0, 2}) put(length);
  for (int64_t pointer : {0, 12, 16}) put(pointer);
  for (int64_t document : {0, 3}) put(document);
  {
    std::FILE* f = std::fopen((prefix + ".idx").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(index.data(), 1, index.size(), f);
    std::fclose(f);
  }
  KEEL_ASSERT_OK_AND_ASSIGN(IndexedDataset tokens, IndexedDataset::Open(prefix));
  ASSERT_FALSE(tokens.contiguous());
  FixedWindowDatasetOptions options;
  options.sequence_length = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(FixedWindowDataset gpt, FixedWindowDataset::Create(tokens, options));
  EXPECT_EQ(gpt.size(), 2);  // (5 - 1) / 2
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor first, gpt.Sample(0));
  EXPECT_THAT(ToVector(first), ElementsAre(0, 1, 2));
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor second, gpt.Sample(1));
  EXPECT_THAT(ToVector(second), ElementsAre(2, 3, 4));  // skips the gap and the empty sequence
}

TEST(GptDatasetTest, RejectsWhatMegatronAsserts) {
  const auto kInvalidArgument = absl::StatusCode::kInvalidArgument;
  IndexedDataset tokens = Write("asserts", TokenDtype::kInt32, {5});
  FixedWindowDatasetOptions options;
  options.sequence_length = 1;
  EXPECT_THAT(FixedWindowDataset::Create(tokens, options),
              StatusIs(kInvalidArgument, HasSubstr("sequence_length (1) must be > 1")));
  options.sequence_length = 4;
  EXPECT_THAT(FixedWindowDataset::Create(Write("one_token", TokenDtype::kInt32, {1}), options),
              StatusIs(kInvalidArgument, HasSubstr("the dataset has 1 tokens")));
  EXPECT_THAT(FixedWindowDataset::Create(Write("floats", TokenDtype::kFloat32, {5}), options),
              StatusIs(kInvalidArgument, HasSubstr("float32: GPT needs integers")));
}

TEST(GptDatasetTest, TooFewTokensForOneSampleIsEmpty) {
  FixedWindowDatasetOptions options;
  options.sequence_length = 8;
  KEEL_ASSERT_OK_AND_ASSIGN(
      FixedWindowDataset gpt,
      FixedWindowDataset::Create(Write("short", TokenDtype::kInt32, {8}), options));
  EXPECT_EQ(gpt.size(), 0);  // (8 - 1) / 8
}

}  // namespace
}  // namespace keel::sampling
