// Runs the real //tools:parity binary on the vendored golden cases and checks what it wrote.
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

ABSL_FLAG(std::string, parity, "", "Path of the //tools:parity binary.");

namespace keel::tools {
namespace {

using ::keel::base::Json;
using ::testing::IsEmpty;

int RunParity(const std::string& args) {
  return std::system(absl::StrCat(absl::GetFlag(FLAGS_parity), " ", args, " 2>/dev/null").c_str());
}

TEST(ParityToolTest, WritesActualBesideExpectedForEveryCase) {
  const std::string out = keel::testing::NewTempDir("one") + "/param_scheduler.json";
  ASSERT_EQ(RunParity(absl::StrCat("--component=param_scheduler --cases=",
                                   absl::GetFlag(FLAGS_golden), " --out=", out)),
            0);
  KEEL_ASSERT_OK_AND_ASSIGN(Json written, base::ReadJsonFile(out));
  KEEL_ASSERT_OK_AND_ASSIGN(Json golden, base::ReadJsonFile(absl::GetFlag(FLAGS_golden)));
  EXPECT_EQ(written["component"], golden["component"]);  // the header is kept
  ASSERT_EQ(written["cases"].size(), golden["cases"].size());
  for (const Json& c : written["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ASSERT_TRUE(c.contains("actual"));
    auto keys = c.items().begin();
    while (keys.key() != "expected") ++keys;
    EXPECT_EQ((++keys).key(), "actual");  // right after expected
    if (c["expected"].contains("error")) {
      EXPECT_TRUE(c["actual"].contains("error"));
      EXPECT_TRUE(c["actual"]["error"].is_string());
    } else {
      EXPECT_THAT(keel::testing::GoldenDiff(c["expected"], c["actual"], 0), IsEmpty());
    }
  }
}

TEST(ParityToolTest, AllComponentsWriteOneFileEachIntoTheOutputFolder) {
  const std::string out = keel::testing::NewTempDir("all") + "/nested";
  ASSERT_EQ(RunParity(absl::StrCat("--out=", out)), 0);
  for (const char* component :
       {"gpt_dataset", "grad_utils", "mesh", "param_scheduler", "samplers", "step_scheduler"}) {
    SCOPED_TRACE(component);
    KEEL_ASSERT_OK_AND_ASSIGN(Json written,
                              base::ReadJsonFile(absl::StrCat(out, "/", component, ".json")));
    EXPECT_EQ(written["component"], component);
    EXPECT_FALSE(written["cases"].empty());
  }
}

// A StepScheduler over a loader that yields nothing, with both max_steps and num_epochs: NeMo
// divides by zero at the first flag read. The tool reports it as an error case, like any other.
TEST(ParityToolTest, ReportsAnEmptyDataSourceAsAnError) {
  const std::string dir = keel::testing::NewTempDir("empty_source");
  const Json cases = Json::parse(R"({"component": "step_scheduler", "cases": [{
      "name": "empty_dataloader", "feature": "degenerate input",
      "inputs": {"global_batch_size": 8, "local_batch_size": 2, "dp_size": 2,
                 "ckpt_every_steps": 1000, "save_checkpoint_every_epoch": true,
                 "val_every_steps": null, "log_remote_every_steps": 1,
                 "loss_average_window_steps": 50, "gc_every_steps": null, "start_step": 0,
                 "start_epoch": 0, "num_epochs": 1, "max_steps": 1000, "preemption_signal": null,
                 "dataloader": {"num_batches": 0, "has_len": true, "sampler_set_epoch": false}},
      "expected": {"error": "ZeroDivisionError", "error_type": "ZeroDivisionError"}}]})");
  KEEL_ASSERT_OK(base::WriteJsonFile(dir + "/cases.json", cases));
  ASSERT_EQ(RunParity(absl::StrCat("--component=step_scheduler --cases=", dir,
                                   "/cases.json --out=", dir, "/out.json")),
            0);
  KEEL_ASSERT_OK_AND_ASSIGN(Json written, base::ReadJsonFile(dir + "/out.json"));
  const Json& actual = written["cases"][0]["actual"];
  ASSERT_TRUE(actual.contains("error")) << actual.dump();
  EXPECT_THAT(actual["error"].get<std::string>(),
              ::testing::HasSubstr("the data source yields no micro-batch"));
}

TEST(ParityToolTest, RejectsAnUnknownComponent) {
  EXPECT_NE(RunParity("--component=nonexistent"), 0);
}

}  // namespace
}  // namespace keel::tools
