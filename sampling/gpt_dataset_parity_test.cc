#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/gpt_dataset_cases.h"
#include "testing/golden.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::LoadGoldenCases;
using ::keel::testing::MatchesGolden;

// Index arrays, tokens and masks are integers, and the weights are the same double
// operations as numpy's: 0 ulps. The golden cases list a few samples of each split; Keel
// gives every one, and the comparison keeps those listed.
TEST(GptDatasetParityTest, MatchesMegatronOnEveryCase) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<base::Json> actual = RunGptDatasetCase(c.inputs);
    if (actual.ok()) actual = SelectGoldenSamples(c.expected, *std::move(actual));
    EXPECT_THAT(actual, MatchesGolden(c.expected, /*max_ulps=*/0));
  }
}

// Megatron's GPTDatasetConfig asserts a tokenizer: a case without one is refused, as upstream
// refuses it, instead of running with no end-of-document or pad id.
TEST(GptDatasetParityTest, ACaseWithoutATokenizerIsRefused) {
  KEEL_ASSERT_OK_AND_ASSIGN(auto cases, LoadGoldenCases());
  ASSERT_FALSE(cases.empty());
  const base::Json& inputs = cases.front().inputs;
  ASSERT_TRUE(inputs.contains("tokenizer"));
  KEEL_EXPECT_OK(RunGptDatasetCase(inputs).status());
  base::Json without = inputs;
  without.erase("tokenizer");
  base::Json null_tokenizer = inputs;
  null_tokenizer["tokenizer"] = nullptr;
  for (const base::Json& refused : {without, null_tokenizer}) {
    EXPECT_THAT(RunGptDatasetCase(refused),
                keel::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                        ::testing::HasSubstr("inputs.tokenizer is missing")));
  }
}

}  // namespace
}  // namespace keel::sampling
