#include "gradients/tail_padding.h"

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CountTailPaddingTest, CountsOnlyTheTrailingRunOfEachRow) {
  // Rows: 2 trailing, 0 trailing (padding only in front), 3 trailing: 5 in all.
  const at::Tensor labels =
      at::tensor({-100, 1, 1, -100, -100, -100, -100, 2, 3, 4, 5, 6, -100, -100, -100}, at::kLong)
          .reshape({3, 5});
  KEEL_ASSERT_OK_AND_ASSIGN(int64_t count, CountTailPadding(labels));
  EXPECT_EQ(count, 5);
  KEEL_ASSERT_OK_AND_ASSIGN(count, CountTailPadding(labels.to(at::kInt), /*ignore_label=*/6));
  EXPECT_EQ(count, 0);
  KEEL_ASSERT_OK_AND_ASSIGN(count, CountTailPadding(at::full({2, 4}, -1, at::kLong), -1));
  EXPECT_EQ(count, 8);  // all padding
  KEEL_ASSERT_OK_AND_ASSIGN(count, CountTailPadding(at::zeros({2, 0}, at::kLong)));
  EXPECT_EQ(count, 0);
}

TEST(CountTailPaddingTest, RejectsNon2DAndNonIntegerLabels) {
  EXPECT_THAT(
      CountTailPadding(at::zeros({4}, at::kLong)),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("2-D [batch, seq] tensor, got 1-D")));
  EXPECT_THAT(CountTailPadding(at::zeros({2, 2}, at::kFloat)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("integer dtype, got Float")));
  EXPECT_THAT(CountTailPadding(at::Tensor()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("undefined")));
}

}  // namespace
}  // namespace keel::gradients
