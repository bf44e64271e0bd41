// Runs the real //tools:data binary on indexed datasets written here and checks its exit
// status and output.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"

ABSL_FLAG(std::string, data, "", "Path of the //tools:data binary.");
ABSL_FLAG(std::string, config, "", "Path of tools/recipe/default.textproto.");

namespace keel::tools {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::SizeIs;

struct ToolResult {
  int exit_code;
  std::string out;
  std::string err;
};

class DataToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = keel::testing::NewTempDir("data_tool");
    for (const char* name : {"a", "b"}) {
      auto writer =
          sampling::IndexedDatasetWriter::Create(dir_ + "/" + name, sampling::TokenDtype::kUint16);
      ASSERT_TRUE(writer.ok());
      for (int64_t d = 0; d < 100; ++d) {
        std::vector<int64_t> tokens(10 + d % 30, d + 1);
        ASSERT_TRUE(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}).ok());
      }
      ASSERT_TRUE(writer->Finalize().ok());
    }
  }

  // data <args> with the default config of 10 steps of 16 samples over this test's datasets.
  ToolResult Run(std::vector<std::string> args, const std::string& paths) {
    std::vector<std::string> argv = {absl::GetFlag(FLAGS_data),
                                     "--config=" + absl::GetFlag(FLAGS_config),
                                     "--set",
                                     "run_dir=" + dir_ + "/run",
                                     "--set",
                                     "data.paths=" + paths,
                                     "--set",
                                     "data.validation_every_n_samples=0",
                                     "--set",
                                     "data.index_mapping_dir=" + dir_ + "/cache",
                                     "--set",
                                     "data.sequence_length=8",
                                     "--set",
                                     "step_scheduler.max_steps=10",
                                     "--set",
                                     "sampler.dataloader_type=single"};
    argv.insert(argv.end(), args.begin(), args.end());
    cli::SubprocessOptions options;
    options.stderr_path = dir_ + "/stderr";
    options.pipe_stdout = true;
    cli::Subprocess child = cli::Subprocess::Start(argv, options);
    const std::string out = child.DrainStdout();
    const int code = child.Wait();
    return {code, out, child.Stderr()};
  }

  std::string Paths(double wa, double wb) const {
    return absl::StrCat(wa, " ", dir_, "/a ", wb, " ", dir_, "/b");
  }

  std::string dir_;
};

TEST_F(DataToolTest, SummaryPrintsThePlanAndBuildsNothing) {
  const ToolResult result = Run({"summary"}, Paths(0.25, 0.75));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  // 10 steps x 16 samples = 160: ceil(160 * 0.25) = 40 from a, 120 from b.
  EXPECT_THAT(result.out, AllOf(HasSubstr("train: 160 samples (blend)"),
                                HasSubstr("/a: weight 0.25, 40 samples drawn"),
                                HasSubstr("/b: weight 0.75, 120 samples drawn")));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/cache"));
}

TEST_F(DataToolTest, SamplesComeInTrainingOrderFromEachDatasetsStream) {
  const ToolResult result = Run({"samples", "--first=3", "--count=40"}, Paths(0.25, 0.75));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> lines = absl::StrSplit(result.out, '\n', absl::SkipEmpty());
  ASSERT_THAT(lines, SizeIs(40));
  std::map<std::string, std::vector<int64_t>> streams;
  for (size_t i = 0; i < lines.size(); ++i) {
    const base::Json line = base::Json::parse(lines[i]);
    EXPECT_EQ(line["index"], static_cast<int64_t>(3 + i));
    EXPECT_THAT(line["tokens"], SizeIs(9));  // sequence_length + 1
    streams[line["dataset"].get<std::string>()].push_back(line["dataset_sample"]);
  }
  // The "single" sampler consumes positions in order; a blend serves each dataset's samples
  // in order, 0, 1, 2, ...; positions 3 to 42 at 0.25 / 0.75 hold 10 of a (within one).
  ASSERT_THAT(streams, SizeIs(2));
  for (const auto& [dataset, samples] : streams) {
    for (size_t k = 1; k < samples.size(); ++k) EXPECT_EQ(samples[k], samples[k - 1] + 1);
  }
  EXPECT_NEAR(static_cast<double>(streams[dir_ + "/a"].size()), 10.0, 1.0);
  // A second run reads the cache and prints the same.
  EXPECT_EQ(Run({"samples", "--first=3", "--count=40"}, Paths(0.25, 0.75)).out, result.out);
}

TEST_F(DataToolTest, BadUsageAndDataExitWithTwo) {
  EXPECT_EQ(Run({"frobnicate"}, Paths(1, 1)).exit_code, 2);
  // Flags Abseil cannot parse: it exits with 1 itself, cli::ParseFlags makes them bad usage.
  const ToolResult unknown = Run({"samples", "--frist=3"}, Paths(1, 1));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("Unknown command line flag 'frist'"));
  const ToolResult illegal = Run({"samples", "--first=three"}, Paths(1, 1));
  EXPECT_EQ(illegal.exit_code, 2);
  EXPECT_THAT(illegal.err, HasSubstr("Illegal value 'three' specified for flag 'first'"));
  const ToolResult weight = Run({"summary"}, Paths(0, 1));
  EXPECT_EQ(weight.exit_code, 2);
  EXPECT_THAT(weight.err, HasSubstr("must be a positive number"));
  const ToolResult missing = Run({"samples"}, dir_ + "/missing");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/missing\", which is not an indexed dataset"));
  const ToolResult split = Run({"samples", "--split=test"}, Paths(1, 1));
  EXPECT_EQ(split.exit_code, 2);
  EXPECT_THAT(split.err, HasSubstr("--split=test"));
  const ToolResult empty =
      Run({"samples", "--split=valid", "--set", "data.split=100,0,0"}, Paths(1, 1));
  EXPECT_EQ(empty.exit_code, 2);
  EXPECT_THAT(empty.err, HasSubstr("--split=valid is empty: data.split \"100,0,0\" gives it no "
                                   "samples"));
  // 10 steps x 16 samples: 160 in training order.
  const ToolResult past = Run({"samples", "--first=160"}, Paths(1, 1));
  EXPECT_EQ(past.exit_code, 2);
  EXPECT_THAT(past.err, HasSubstr("--first=160 is past the end: the train split gives 160 "
                                  "samples in the order training consumes them; allowed: "
                                  "--first below 160"));
  EXPECT_TRUE(past.out.empty());
}

// --count to int64's end prints the rest of the order; the sum of --first and --count does
// not wrap around.
TEST_F(DataToolTest, ACountPastTheEndPrintsTheRest) {
  const ToolResult rest =
      Run({"samples", "--first=150", "--count=9223372036854775807"}, Paths(1, 1));
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_THAT(std::vector<std::string>(absl::StrSplit(rest.out, '\n', absl::SkipEmpty())),
              SizeIs(10));
}

}  // namespace
}  // namespace keel::tools
