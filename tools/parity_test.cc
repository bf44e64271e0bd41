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
  for (const char* component : {"grad_utils", "param_scheduler", "samplers", "step_scheduler"}) {
    SCOPED_TRACE(component);
    KEEL_ASSERT_OK_AND_ASSIGN(Json written,
                              base::ReadJsonFile(absl::StrCat(out, "/", component, ".json")));
    EXPECT_EQ(written["component"], component);
    EXPECT_FALSE(written["cases"].empty());
  }
}

TEST(ParityToolTest, RejectsAnUnknownComponent) {
  EXPECT_NE(RunParity("--component=nonexistent"), 0);
}

}  // namespace
}  // namespace keel::tools
