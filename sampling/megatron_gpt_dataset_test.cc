#include "sampling/megatron_gpt_dataset.h"

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/blended_dataset.h"
#include "sampling/indexed_dataset.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::keel::testing::WriteFileOrFail;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAreArray;

// Documents of the given lengths; token j of document d is 100 * d + j.
std::shared_ptr<const IndexedDataset> WriteDataset(const std::string& prefix,
                                                   const std::vector<int64_t>& lengths) {
  auto writer = IndexedDatasetWriter::Create(prefix, TokenDtype::kUint16);
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int64_t> tokens;
    for (int64_t j = 0; j < lengths[d]; ++j) tokens.push_back(100 * d + j);
    EXPECT_TRUE(writer->AddDocument(tokens, {lengths[d]}).ok());
  }
  EXPECT_TRUE(writer->Finalize().ok());
  auto dataset = IndexedDataset::Open(prefix);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return std::make_shared<const IndexedDataset>(*std::move(dataset));
}

GptDatasetConfig Config(const std::string& cache) {
  GptDatasetConfig config;
  config.random_seed = 1234;
  config.sequence_length = 4;
  config.blend = Blend{{"unused"}, std::nullopt};
  config.split = "100,0,0";
  config.path_to_cache = cache;
  config.reset_position_ids = config.reset_attention_mask = config.eod_mask_loss = false;
  return config;
}

std::vector<std::string> Files(const std::string& dir) {
  auto names = base::ListDirectory(dir);
  return names.ok() ? *names : std::vector<std::string>();
}

TEST(MegatronGptDatasetTest, BuildsWritesAndReusesItsCache) {
  const std::string dir = NewTempDir("gpt_cache");
  auto indexed = WriteDataset(dir + "/a", {5, 7, 3, 9});
  const GptDatasetConfig config = Config(dir + "/cache");
  KEEL_ASSERT_OK_AND_ASSIGN(auto built, MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, 10,
                                                                   Split::kTrain, config));
  // 24 tokens per epoch; 10 samples need 10 * 4 + 1 = 41 tokens: 2 epochs, (48 - 1) / 4 = 11
  // samples.
  EXPECT_EQ(built->num_epochs(), 2);
  EXPECT_EQ(built->size(), 11);
  const std::vector<std::string> files = Files(dir + "/cache");
  ASSERT_THAT(files, SizeIs(4));  // no temporary file is left
  const std::string hash = files[0].substr(0, 32);
  EXPECT_THAT(files, UnorderedElementsAreArray({
                         hash + "-GPTDataset-train-description.txt",
                         hash + "-GPTDataset-train-document_index.npy",
                         hash + "-GPTDataset-train-sample_index.npy",
                         hash + "-GPTDataset-train-shuffle_index.npy",
                     }));
  const std::string description =
      ReadFileOrFail(dir + "/cache/" + hash + "-GPTDataset-train-description.txt");
  EXPECT_THAT(description, HasSubstr("\"num_samples\": 10,\n"));
  EXPECT_THAT(description, HasSubstr("\"split_matrix\": [\n        [\n            0,\n"));

  // A second dataset of the same description loads the files: read-only ones serve.
  for (const std::string& name : files) ::chmod((dir + "/cache/" + name).c_str(), 0444);
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto loaded, MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, 10, Split::kTrain,
                                              config, IndexCacheMode::kLoadOnly));
  ASSERT_EQ(loaded->size(), built->size());
  for (int64_t i = 0; i < built->size(); ++i) {
    EXPECT_EQ(loaded->shuffle_index(i), built->shuffle_index(i));
    EXPECT_EQ(loaded->sample_index(i, 0), built->sample_index(i, 0));
    EXPECT_EQ(loaded->sample_index(i, 1), built->sample_index(i, 1));
  }
  EXPECT_THAT(Files(dir + "/cache"), SizeIs(4));
}

TEST(MegatronGptDatasetTest, SamplesAreWindowsOfTheShuffledDocuments) {
  const std::string dir = NewTempDir("gpt_windows");
  auto indexed = WriteDataset(dir + "/a", {5, 7, 3, 9});
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto gpt, MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, std::nullopt, Split::kTrain,
                                           Config(dir + "/cache")));
  // One epoch of 24 tokens: (24 - 1) / 4 = 5 windows of 5 tokens, sharing their last token
  // with the next one. Laid end to end in the document order they cover tokens 0..20.
  ASSERT_EQ(gpt->size(), 5);
  std::vector<int64_t> order;
  for (int64_t i = 0; i < gpt->document_index_size(); ++i) order.push_back(gpt->document_index(i));
  std::vector<int64_t> stream;
  for (int64_t d : order) {
    for (int64_t j = 0; j < indexed->sequence_length(d); ++j) stream.push_back(100 * d + j);
  }
  std::vector<bool> seen(5, false);
  for (int64_t idx = 0; idx < 5; ++idx) {
    std::vector<int64_t> window(5);
    KEEL_ASSERT_OK(gpt->Window(idx, absl::MakeSpan(window)));
    const int64_t k = gpt->shuffle_index(idx);
    seen[k] = true;
    EXPECT_EQ(window, std::vector<int64_t>(stream.begin() + 4 * k, stream.begin() + 4 * k + 5));
  }
  EXPECT_THAT(seen, ::testing::Each(true));
  std::vector<int64_t> window(5);
  EXPECT_THAT(gpt->Window(5, absl::MakeSpan(window)),
              StatusIs(StatusCode::kOutOfRange, HasSubstr("sample 5 is outside [0, 5)")));
}

TEST(MegatronGptDatasetTest, LoadOnlyWithoutCacheIsNotFound) {
  const std::string dir = NewTempDir("gpt_load_only");
  auto indexed = WriteDataset(dir + "/a", {5, 7});
  EXPECT_THAT(MegatronGptDataset::Create(indexed, dir + "/a", {0, 2}, std::nullopt, Split::kTrain,
                                         Config(dir + "/cache"), IndexCacheMode::kLoadOnly),
              StatusIs(StatusCode::kNotFound, HasSubstr("has not written it")));
}

TEST(MegatronGptDatasetTest, PlanOnlyWritesNothingAndReadsNoSample) {
  const std::string dir = NewTempDir("gpt_plan");
  auto indexed = WriteDataset(dir + "/a", {5, 7});
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto planned, MegatronGptDataset::Create(indexed, dir + "/a", {0, 2}, 100, Split::kTrain,
                                               Config(dir + "/cache"), IndexCacheMode::kPlanOnly));
  // 100 * 4 + 1 = 401 tokens of 12 per epoch: 34 epochs, (408 - 1) / 4 = 101 samples.
  EXPECT_EQ(planned->num_epochs(), 34);
  EXPECT_EQ(planned->size(), 101);
  EXPECT_FALSE(base::PathExists(dir + "/cache"));
  std::vector<int64_t> window(5);
  EXPECT_THAT(planned->Window(0, absl::MakeSpan(window)),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("planned")));
}

TEST(MegatronGptDatasetTest, DefaultCacheDirectoryIsMegatronsBesideTheDataset) {
  const std::string dir = NewTempDir("gpt_default_cache");
  auto indexed = WriteDataset(dir + "/a", {5, 7});
  GptDatasetConfig config = Config("");
  config.path_to_cache.reset();
  KEEL_ASSERT_OK(
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 2}, std::nullopt, Split::kTrain, config)
          .status());
  EXPECT_THAT(Files(dir + "/a/cache/GPTDataset_indices"), SizeIs(4));
}

TEST(MegatronGptDatasetTest, CacheOfAnotherConfigurationIsRefused) {
  const std::string dir = NewTempDir("gpt_mismatch");
  auto indexed = WriteDataset(dir + "/a", {5, 7, 3, 9});
  GptDatasetConfig config = Config(dir + "/cache");
  KEEL_ASSERT_OK(
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, std::nullopt, Split::kTrain, config)
          .status());
  // Megatron's cache name leaves add_extra_token_to_sequence out: 24 tokens give 6 samples
  // without the extra token, where the cached index holds 5.
  config.add_extra_token_to_sequence = false;
  EXPECT_THAT(
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, std::nullopt, Split::kTrain, config),
      StatusIs(StatusCode::kDataLoss, HasSubstr("delete it to rebuild")));
}

TEST(MegatronGptDatasetTest, CorruptCacheEntriesAreDataLossNotCrashes) {
  const std::string dir = NewTempDir("gpt_corrupt");
  auto indexed = WriteDataset(dir + "/a", {5, 7, 3, 9});
  const GptDatasetConfig config = Config(dir + "/cache");
  KEEL_ASSERT_OK(
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, std::nullopt, Split::kTrain, config)
          .status());
  for (const std::string& name : Files(dir + "/cache")) {
    if (!absl::EndsWith(name, "shuffle_index.npy")) continue;
    // Point sample 0 at row 99 of a 5-row index (the data starts after the 128-byte header).
    std::string bytes = ReadFileOrFail(dir + "/cache/" + name);
    bytes[128] = 99;
    WriteFileOrFail(dir + "/cache/" + name, bytes);
  }
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto gpt,
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 4}, std::nullopt, Split::kTrain, config));
  std::vector<int64_t> window(5);
  EXPECT_THAT(gpt->Window(0, absl::MakeSpan(window)),
              StatusIs(StatusCode::kDataLoss, HasSubstr("maps 0 to 99")));
}

TEST(MegatronGptDatasetTest, TokensOutsideTheVocabularyAreRefused) {
  const std::string dir = NewTempDir("gpt_vocab");
  auto indexed = WriteDataset(dir + "/a", {5, 7});  // tokens up to 106
  GptDatasetConfig config = Config(dir + "/cache");
  config.tokenizer.vocab_size = 100;
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto gpt,
      MegatronGptDataset::Create(indexed, dir + "/a", {0, 2}, std::nullopt, Split::kTrain, config));
  bool refused = false;
  for (int64_t idx = 0; idx < gpt->size(); ++idx) {
    std::vector<int64_t> window(5);
    const absl::Status status = gpt->Window(idx, absl::MakeSpan(window));
    if (status.ok()) continue;
    refused = true;
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument,
                                 HasSubstr("is outside the vocabulary [0, 100)")));
  }
  EXPECT_TRUE(refused);
}

TEST(MegatronGptDatasetTest, SplitsWithTooFewTokensAreRefusedNotLoopedOn) {
  const std::string dir = NewTempDir("gpt_empty");
  auto indexed = WriteDataset(dir + "/a", {5, 1, 7});
  // Megatron never returns for an empty split asked for samples, and aborts for one token.
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{3, 3}, {1, 2}}) {
    EXPECT_THAT(
        MegatronGptDataset::Create(indexed, dir + "/a", {begin, end}, 10, Split::kTest,
                                   Config(dir + "/cache")),
        StatusIs(StatusCode::kInvalidArgument, HasSubstr("a GPT dataset needs at least 2")));
  }
}

TEST(BlendingIndicesTest, ContinuingFromAPositionEqualsBuildingInOneGo) {
  const std::vector<double> weights = {0.2, 0.3, 0.5};
  std::vector<int64_t> taken(3, 0), offsets(3, 0);
  std::vector<int16_t> whole(100);
  std::vector<int64_t> whole_samples(100);
  BuildBlendingIndices(weights, 0, 100, absl::MakeSpan(taken), offsets, whole.data(),
                       whole_samples.data());
  // Counts follow the weights within one sample.
  EXPECT_THAT(taken, ElementsAre(20, 30, 50));
  std::vector<int64_t> resumed_taken(3, 0);
  std::vector<int16_t> first(37), rest(63);
  std::vector<int64_t> first_samples(37), rest_samples(63);
  BuildBlendingIndices(weights, 0, 37, absl::MakeSpan(resumed_taken), offsets, first.data(),
                       first_samples.data());
  BuildBlendingIndices(weights, 37, 63, absl::MakeSpan(resumed_taken), offsets, rest.data(),
                       rest_samples.data());
  first.insert(first.end(), rest.begin(), rest.end());
  first_samples.insert(first_samples.end(), rest_samples.begin(), rest_samples.end());
  EXPECT_EQ(first, whole);
  EXPECT_EQ(first_samples, whole_samples);
  // Offsets shift each dataset's samples.
  std::vector<int64_t> shifted_taken(3, 0);
  const std::vector<int64_t> shift = {1000, 2000, 3000};
  std::vector<int16_t> shifted(100);
  std::vector<int64_t> shifted_samples(100);
  BuildBlendingIndices(weights, 0, 100, absl::MakeSpan(shifted_taken), shift, shifted.data(),
                       shifted_samples.data());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(shifted_samples[i], whole_samples[i] + shift[whole[i]]);
}

}  // namespace
}  // namespace keel::sampling
