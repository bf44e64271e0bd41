#include "sampling/resumable_blend.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/gpt_dataset_builder.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::absl::StatusCode;
using ::keel::testing::NewTempDir;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// Two datasets of 30 documents of 5 to 14 tokens.
class ResumableBlendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewTempDir("resumable_blend");
    for (const char* name : {"a", "b", "c"}) {
      auto writer = IndexedDatasetWriter::Create(Prefix(name), TokenDtype::kUint16);
      ASSERT_TRUE(writer.ok());
      for (int64_t d = 0; d < 30; ++d) {
        std::vector<int64_t> tokens(5 + (d * 7) % 10, d);
        ASSERT_TRUE(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}).ok());
      }
      ASSERT_TRUE(writer->Finalize().ok());
    }
  }

  std::string Prefix(const std::string& name) const { return dir_ + "/" + name; }

  GptDatasetConfig Config(std::vector<std::string> names, std::vector<double> weights) const {
    GptDatasetConfig config;
    config.random_seed = 1234;
    config.sequence_length = 8;
    config.blend = Blend{{}, weights};
    for (const std::string& name : names) config.blend->prefixes.push_back(Prefix(name));
    config.split = "100,0,0";
    config.path_to_cache = dir_ + "/cache";
    config.reset_position_ids = config.reset_attention_mask = config.eod_mask_loss = false;
    return config;
  }

  GptSplitView Train(const GptDatasetConfig& config, int64_t size) {
    GptBuildOptions options;
    options.splits_to_build = {true, false, false};
    auto splits = BuildGptDatasets(config, {size, 0, 0}, options);
    EXPECT_TRUE(splits.ok()) << splits.status();
    auto view = GptSplitView::Of((*splits)[0]);
    EXPECT_TRUE(view.ok()) << view.status();
    return *view;
  }

  std::string dir_;
};

// (dataset path, stream sample) of positions [from, to).
std::vector<std::pair<std::string, int64_t>> Served(ResumableBlend& blend, int64_t from,
                                                    int64_t to) {
  std::vector<std::pair<std::string, int64_t>> served;
  for (int64_t p = from; p < to; ++p) {
    auto sample = blend.Locate(p);
    EXPECT_TRUE(sample.ok()) << sample.status();
    if (!sample.ok()) break;
    served.emplace_back(blend.dataset_paths()[sample->dataset], sample->stream_sample);
  }
  return served;
}

TEST_F(ResumableBlendTest, FreshBlendIsMegatrons) {
  const GptDatasetConfig config = Config({"a", "b"}, {0.3, 0.7});
  const GptSplitView train = Train(config, 200);
  KEEL_ASSERT_OK_AND_ASSIGN(auto blend, ResumableBlend::Fresh(train, config));
  ASSERT_EQ(blend->size(), train.size());
  for (int64_t p = 0; p < blend->size(); ++p) {
    KEEL_ASSERT_OK_AND_ASSIGN(BlendSample sample, blend->Locate(p));
    EXPECT_EQ(sample.dataset, train.blend()->dataset_index(p));
    EXPECT_EQ(sample.sample, train.blend()->dataset_sample_index(p));
    EXPECT_EQ(sample.gpt, train.datasets()[sample.dataset].get());
  }
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState state, blend->State(100));
  EXPECT_EQ(state.dataset_consumed[0] + state.dataset_consumed[1], 100);
  EXPECT_EQ(state.dataset_consumed[0], 30);  // 0.3 * 100, the greedy's exact share
}

TEST_F(ResumableBlendTest, UnchangedResumeServesWhatTheRunWouldHave) {
  const GptDatasetConfig config = Config({"a", "b"}, {0.3, 0.7});
  const GptSplitView train = Train(config, 200);
  KEEL_ASSERT_OK_AND_ASSIGN(auto first, ResumableBlend::Fresh(train, config));
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState saved, first->State(77));
  std::vector<std::string> notes;
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto resumed,
      ResumableBlend::Continue(saved, Train(config, 200), config, IndexCacheMode::kBuild, &notes));
  EXPECT_THAT(notes, IsEmpty());
  EXPECT_EQ(Served(*resumed, 77, 200), Served(*first, 77, 200));
}

absl::Status Locate(ResumableBlend& blend, int64_t position) {
  return blend.Locate(position).status();
}

// Every dataset's stream samples served over the run, before and after the resume, are
// 0, 1, 2, ... each once.
void ExpectEachStreamServedOnceInOrder(const std::vector<std::pair<std::string, int64_t>>& run) {
  std::map<std::string, int64_t> next;
  for (const auto& [path, sample] : run) {
    EXPECT_EQ(sample, next[path]) << path;
    next[path] = sample + 1;
  }
}

TEST_F(ResumableBlendTest, NewWeightsContinueEveryDatasetWhereItStopped) {
  const GptDatasetConfig before = Config({"a", "b"}, {0.3, 0.7});
  KEEL_ASSERT_OK_AND_ASSIGN(auto first, ResumableBlend::Fresh(Train(before, 400), before));
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState saved, first->State(150));
  auto run = Served(*first, 0, 150);

  const GptDatasetConfig after = Config({"a", "b"}, {0.8, 0.2});
  std::vector<std::string> notes;
  KEEL_ASSERT_OK_AND_ASSIGN(auto resumed, ResumableBlend::Continue(saved, Train(after, 400), after,
                                                                   IndexCacheMode::kBuild, &notes));
  EXPECT_THAT(notes, Contains(AllOf(HasSubstr("the blend was \"0.3 "), HasSubstr("it is \"0.8 "),
                                    HasSubstr("from sample 150 on"))));
  EXPECT_THAT(Locate(*resumed, 149), StatusIs(StatusCode::kOutOfRange, HasSubstr("resume")));
  const auto rest = Served(*resumed, 150, resumed->size());
  // From the resume on, the new weights: within one sample of 0.8 of the positions.
  int64_t a = 0;
  for (const auto& [path, sample] : rest) a += path == Prefix("a");
  EXPECT_LE(std::abs(static_cast<double>(a) - 0.8 * rest.size()), 1.0);
  run.insert(run.end(), rest.begin(), rest.end());
  ExpectEachStreamServedOnceInOrder(run);
  // a needs more than Megatron built for 0.3 of 400: its stream grew a generation.
  EXPECT_THAT(notes, Contains(AllOf(HasSubstr(Prefix("a") + " needs up to"),
                                    HasSubstr("generation 1"), HasSubstr("seed 1235"))));
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState state, resumed->State(resumed->size()));
  EXPECT_THAT(state.generations[0], SizeIs(2));
  EXPECT_EQ(state.segment_start, 150);
  EXPECT_EQ(state.dataset_consumed[0], saved.dataset_consumed[0] + a);
}

TEST_F(ResumableBlendTest, ASecondResumeGoesOnWithTheFirstOnesBlend) {
  const GptDatasetConfig before = Config({"a", "b"}, {0.3, 0.7});
  KEEL_ASSERT_OK_AND_ASSIGN(auto first, ResumableBlend::Fresh(Train(before, 400), before));
  const GptDatasetConfig after = Config({"a", "b"}, {0.6, 0.4});
  std::vector<std::string> notes;
  KEEL_ASSERT_OK_AND_ASSIGN(auto second,
                            ResumableBlend::Continue(*first->State(100), Train(after, 400), after,
                                                     IndexCacheMode::kBuild, &notes));
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState at_250, second->State(250));
  notes.clear();
  KEEL_ASSERT_OK_AND_ASSIGN(auto third, ResumableBlend::Continue(at_250, Train(after, 400), after,
                                                                 IndexCacheMode::kBuild, &notes));
  // Nothing changed since the second run: the same segment, the same samples.
  EXPECT_THAT(notes, ElementsAre(HasSubstr("continues its stream where it stopped")));
  EXPECT_EQ(Served(*third, 250, 400), Served(*second, 250, 400));
}

TEST_F(ResumableBlendTest, ALongerRunKeepsEachDatasetsOrder) {
  // Same weights, more steps: Megatron would size (and so shuffle) every dataset anew.
  const GptDatasetConfig config = Config({"a", "b"}, {0.5, 0.5});
  KEEL_ASSERT_OK_AND_ASSIGN(auto first, ResumableBlend::Fresh(Train(config, 100), config));
  auto run = Served(*first, 0, 60);
  std::vector<std::string> notes;
  KEEL_ASSERT_OK_AND_ASSIGN(auto longer,
                            ResumableBlend::Continue(*first->State(60), Train(config, 1000), config,
                                                     IndexCacheMode::kBuild, &notes));
  EXPECT_EQ(longer->size(), 1000);
  const auto rest = Served(*longer, 60, 1000);
  // The first run's generation 0 goes on where it stopped, then the streams grow.
  for (int64_t p = 60; p < 100; ++p) {
    EXPECT_EQ(rest[p - 60], Served(*first, p, p + 1)[0]);
  }
  run.insert(run.end(), rest.begin(), rest.end());
  ExpectEachStreamServedOnceInOrder(run);
}

TEST_F(ResumableBlendTest, AddedAndRemovedDatasets) {
  const GptDatasetConfig before = Config({"a", "b"}, {0.5, 0.5});
  KEEL_ASSERT_OK_AND_ASSIGN(auto first, ResumableBlend::Fresh(Train(before, 300), before));
  auto run = Served(*first, 0, 120);
  const GptDatasetConfig after = Config({"b", "c"}, {0.5, 0.5});
  std::vector<std::string> notes;
  KEEL_ASSERT_OK_AND_ASSIGN(auto resumed,
                            ResumableBlend::Continue(*first->State(120), Train(after, 300), after,
                                                     IndexCacheMode::kBuild, &notes));
  EXPECT_THAT(notes, Contains(HasSubstr(Prefix("c") + " is new")));
  EXPECT_THAT(notes, Contains(HasSubstr(Prefix("a") + " is no longer blended")));
  const auto rest = Served(*resumed, 120, 300);
  run.insert(run.end(), rest.begin(), rest.end());
  ExpectEachStreamServedOnceInOrder(run);
}

// The state after more samples than the blend has (a checkpoint whose consumed samples outran
// it), or before its resume position, is an error: it aborted the process, reading a position
// past the end.
TEST_F(ResumableBlendTest, AStateOutsideTheBlendIsAnError) {
  const GptDatasetConfig config = Config({"a", "b"}, {0.5, 0.5});
  KEEL_ASSERT_OK_AND_ASSIGN(auto blend, ResumableBlend::Fresh(Train(config, 100), config));
  const int64_t size = blend->size();
  EXPECT_THAT(
      blend->State(size + 1),
      StatusIs(StatusCode::kOutOfRange,
               HasSubstr(absl::StrCat("after ", size + 1, " samples: outside [0, ", size, "]"))));
  EXPECT_THAT(blend->State(-1), StatusIs(StatusCode::kOutOfRange, HasSubstr("after -1 samples")));
  KEEL_ASSERT_OK_AND_ASSIGN(const BlendState state, blend->State(size));
  EXPECT_EQ(state.dataset_consumed[0] + state.dataset_consumed[1], size);
}

TEST_F(ResumableBlendTest, MalformedStatesAreRefused) {
  const GptDatasetConfig config = Config({"a", "b"}, {0.5, 0.5});
  KEEL_ASSERT_OK_AND_ASSIGN(auto blend, ResumableBlend::Fresh(Train(config, 100), config));
  KEEL_ASSERT_OK_AND_ASSIGN(BlendState state, blend->State(10));
  state.weights.pop_back();
  std::vector<std::string> notes;
  EXPECT_THAT(
      ResumableBlend::Continue(state, Train(config, 100), config, IndexCacheMode::kBuild, &notes),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("one weight, count")));
}

}  // namespace
}  // namespace keel::sampling
