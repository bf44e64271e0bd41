#include "tools/recipe/metrics.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::keel::testing::WriteFileOrFail;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::SizeIs;
using ::testing::StartsWith;

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
  EXPECT_EQ(actual.max_memory_allocated_gib, expected.max_memory_allocated_gib);
  EXPECT_EQ(actual.elapsed_seconds, expected.elapsed_seconds);
  EXPECT_EQ(actual.val_loss, expected.val_loss);
  EXPECT_EQ(actual.skipped_steps, expected.skipped_steps);
}

std::vector<int64_t> Steps(const std::vector<StepMetrics>& history) {
  std::vector<int64_t> steps;
  for (const StepMetrics& m : history) steps.push_back(m.step);
  return steps;
}

TEST(JsonlWriterTest, WritesOneObjectPerLineInFieldOrder) {
  const std::string path = absl::StrCat(NewTempDir("jsonl_line"), "/metrics.jsonl");
  KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
  StepMetrics m = Metrics(3, 2.5, 0.25);
  m.tokens_per_second = std::nullopt;  // a step without a progress line
  KEEL_ASSERT_OK(writer.Write(m));
  m.step = 4;
  m.tokens_per_second = 1000;
  m.max_memory_allocated_gib = 1.5;
  m.val_loss = 2.0;
  m.skipped_steps = 1;
  m.moe_aux_loss = 0.125;
  m.tokens_per_expert = std::vector<int64_t>{3, 5};
  m.restart_count = 2;
  m.restart_cause = "rank 1 killed by signal 9";
  m.resumed_from_step = 3;
  KEEL_ASSERT_OK(writer.Write(m));
  EXPECT_EQ(ReadFileOrFail(path),
            "{\"step\":3,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
            "\"tokens_per_second\":null,\"max_memory_allocated_gib\":null,"
            "\"elapsed_seconds\":3.0,\"val_loss\":null,"
            "\"skipped_steps\":null,\"moe_aux_loss\":null,\"tokens_per_expert\":null,"
            "\"restart_count\":null,\"restart_cause\":null,\"resumed_from_step\":null}\n"
            "{\"step\":4,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
            "\"tokens_per_second\":1000.0,\"max_memory_allocated_gib\":1.5,"
            "\"elapsed_seconds\":3.0,\"val_loss\":2.0,"
            "\"skipped_steps\":1,\"moe_aux_loss\":0.125,\"tokens_per_expert\":[3,5],"
            "\"restart_count\":2,\"restart_cause\":\"rank 1 killed by signal 9\","
            "\"resumed_from_step\":3}\n");
}

// Lines written before a field that may be absent existed (skipped_steps,
// max_memory_allocated_gib) still read.
TEST(JsonlWriterTest, ReadsLinesWithoutTheOptionalFields) {
  const std::string path = absl::StrCat(NewTempDir("jsonl_older"), "/metrics.jsonl");
  keel::testing::WriteFileOrFail(
      path,
      "{\"step\":3,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
      "\"tokens_per_second\":1000.0,\"elapsed_seconds\":3.0}\n");
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].loss, 2.5);
  EXPECT_FALSE(read[0].val_loss.has_value());
  EXPECT_FALSE(read[0].skipped_steps.has_value());
  EXPECT_FALSE(read[0].max_memory_allocated_gib.has_value());
}

TEST(JsonlWriterTest, RoundTripsDoublesExactly) {
  const std::string path = absl::StrCat(NewTempDir("jsonl_round_trip"), "/metrics.jsonl");
  std::vector<StepMetrics> written = {
      Metrics(1, 0.1, 3e-4),
      Metrics(2, 1.0 / 3.0, std::numeric_limits<double>::denorm_min()),
      Metrics(3, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::max()),
      Metrics(4, std::numeric_limits<double>::infinity(), 2.0 / 7.0),
  };
  written[1].val_loss = 0.30000000000000004;
  written[3].max_memory_allocated_gib = 1.0 / 3.0;
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
  const std::string path = absl::StrCat(NewTempDir("jsonl_append"), "/metrics.jsonl");
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
  EXPECT_THAT(
      std::vector<std::string>(absl::StrSplit(ReadFileOrFail(path), '\n', absl::SkipEmpty())),
      SizeIs(4));
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    KEEL_ASSERT_OK(writer.Write(Metrics(7, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(7));
}

TEST(JsonlWriterTest, ResumedRunReplacesTheStepsItReplays) {
  const std::string path = absl::StrCat(NewTempDir("jsonl_resume"), "/metrics.jsonl");
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
  const std::string path = absl::StrCat(NewTempDir("jsonl_partial"), "/metrics.jsonl");
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/false));
    KEEL_ASSERT_OK(writer.Write(Metrics(1, 3.0, 1e-3)));
  }
  const std::string whole = ReadFileOrFail(path);
  WriteFileOrFail(path, absl::StrCat(whole, "{\"step\":2,\"epo"));  // a crash in mid-write
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    KEEL_ASSERT_OK(writer.Write(Metrics(2, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(1, 2));

  WriteFileOrFail(path, absl::StrCat(whole, "{\"step\":2,\"epo"));
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));  // readable before any resume
  EXPECT_THAT(Steps(read), ElementsAre(1));

  WriteFileOrFail(path, "{\"step\":1,");  // nothing but a partial line
  {
    KEEL_ASSERT_OK_AND_ASSIGN(JsonlWriter writer, JsonlWriter::Create(path, /*append=*/true));
    KEEL_ASSERT_OK(writer.Write(Metrics(9, 2.0, 1e-3)));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(read, ReadJsonl(path));
  EXPECT_THAT(Steps(read), ElementsAre(9));
}

TEST(JsonlWriterTest, UnwritablePathNamesIt) {
  const std::string path = absl::StrCat(NewTempDir("jsonl_missing"), "/no_such_dir/metrics.jsonl");
  EXPECT_THAT(JsonlWriter::Create(path, /*append=*/false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(JsonlWriter::Create(path, /*append=*/true),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(ReadJsonlTest, Errors) {
  const std::string dir = NewTempDir("jsonl_errors");
  const std::string missing = absl::StrCat(dir, "/absent.jsonl");
  EXPECT_THAT(ReadJsonl(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));

  const std::string good =
      "{\"step\":1,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,\"grad_norm\":0.5,"
      "\"tokens_per_second\":1000.0,\"elapsed_seconds\":3.0}\n";
  const std::string path = absl::StrCat(dir, "/bad.jsonl");
  WriteFileOrFail(path, absl::StrCat(good, "\n", "not json\n"));
  EXPECT_THAT(ReadJsonl(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path + ":3: ")));
  WriteFileOrFail(path, absl::StrCat(good, "[1, 2]\n"));
  EXPECT_THAT(ReadJsonl(path), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("JSON object")));
  WriteFileOrFail(path, "{\"step\":1,\"epoch\":0,\"loss\":2.5}\n");
  EXPECT_THAT(ReadJsonl(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(":1: missing field \"lr\"")));
  WriteFileOrFail(path, absl::StrCat(good,
                                     "{\"step\":2.5,\"epoch\":0,\"loss\":2.5,\"lr\":0.25,"
                                     "\"grad_norm\":0.5,\"tokens_per_second\":1.0,"
                                     "\"elapsed_seconds\":3.0,\"val_loss\":null}\n"));
  EXPECT_THAT(ReadJsonl(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(":2: step must be an integer")));

  WriteFileOrFail(path, good);  // val_loss may be absent
  KEEL_ASSERT_OK_AND_ASSIGN(std::vector<StepMetrics> read, ReadJsonl(path));
  ASSERT_THAT(read, SizeIs(1));
  EXPECT_EQ(read[0].val_loss, std::nullopt);
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
  m.skipped_steps = 0;  // counted (on_nonfinite "skip"), none yet: not shown
  EXPECT_THAT(ProgressLine(m, 1000), Not(HasSubstr("skipped")));
  m.skipped_steps = 2;
  EXPECT_EQ(ProgressLine(m, 1000),
            "step  120/1000 | loss 2.3412 | lr 3.00e-04 | grad norm 0.812 | 950 tok/s | "
            "val loss 2.5000 | skipped 2 | ETA 1m50s");
  m.max_memory_allocated_gib = 1.2345;
  EXPECT_EQ(ProgressLine(m, 1000),
            "step  120/1000 | loss 2.3412 | lr 3.00e-04 | grad norm 0.812 | 950 tok/s | "
            "mem 1.23 GiB | val loss 2.5000 | skipped 2 | ETA 1m50s");
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
}  // namespace keel::tools::recipe
