#include "parallel/layout.h"

#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::parallel {
namespace {

using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EvenlyShardedTest, WithoutGroupsTheBlockIsTheWholeTensor) {
  KEEL_ASSERT_OK_AND_ASSIGN(
      TensorLayout layout,
      EvenlySharded({6, 4}, {{"tp", nullptr, Placement::Shard(0)}, {"dp", nullptr, {}}}));
  EXPECT_THAT(layout.offsets, ElementsAre(0, 0));
  EXPECT_THAT(EvenShardShape(layout), ElementsAre(6, 4));
  EXPECT_EQ(layout.dims.size(), 2u);
}

TEST(EvenlyShardedTest, ShardDimensionsMustExist) {
  EXPECT_THAT(EvenlySharded({6}, {{"tp", nullptr, Placement::Shard(1)}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"tp\" shards dimension 1 of a tensor with 1 dimension(s)")));
  EXPECT_THAT(EvenlySharded({-1}, {}), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("global shape size -1 is negative")));
}

// torch.chunk's split on 3 ranks: 10 rows are 4, 4 and 2; a second dimension sharded on top
// of the first splits what the first left (rows 8..9 over 3 ranks of another group would be
// 1, 1, 0). Each rank sees its own block.
TEST(EvenlyShardedTest, EachRankGetsItsTorchChunk) {
  std::vector<std::vector<int64_t>> offsets(3), shapes(3);
  KEEL_ASSERT_OK(keel::testing::RunOnRanks(3, [&](keel::testing::Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(TensorLayout layout,
                          EvenlySharded({10, 5}, {{"tp", r.group.get(), Placement::Shard(0)},
                                                  {"cp", r.group.get(), Placement::Shard(0)},
                                                  {"dp", r.group.get(), Placement::Replicate()}}));
    offsets[r.rank] = layout.offsets;
    shapes[r.rank] = EvenShardShape(layout);
    return absl::OkStatus();
  }));
  // Rank r's tp chunk starts at 4r (4, 4, 2 rows); its cp chunk of that, ceil(rows / 3) each.
  EXPECT_THAT(offsets[0], ElementsAre(0, 0));
  EXPECT_THAT(shapes[0], ElementsAre(2, 5));  // rows 0..3, chunks of 2: rank 0 gets 0..1
  EXPECT_THAT(offsets[1], ElementsAre(4 + 2, 0));
  EXPECT_THAT(shapes[1], ElementsAre(2, 5));  // rows 4..7: rank 1 gets 6..7
  EXPECT_THAT(offsets[2], ElementsAre(8 + 2, 0));
  EXPECT_THAT(shapes[2], ElementsAre(0, 5));  // rows 8..9, chunks of 1: rank 2 gets none
}

TEST(LayoutTest, BlockOfIsAViewOfTheBlockAtTheOffsets) {
  const at::Tensor whole = at::arange(24, at::kFloat).view({4, 6});
  const at::Tensor block = BlockOf(whole, BlockLayout({4, 6}, {2, 3}), {2, 2});
  EXPECT_TRUE(at::equal(block, at::tensor({15.0f, 16.0f, 21.0f, 22.0f}).view({2, 2})));
  block.fill_(-1);  // a view: writes land in the whole tensor
  EXPECT_EQ(whole[2][3].item<float>(), -1);
  EXPECT_EQ(whole[2][2].item<float>(), 14);
}

}  // namespace
}  // namespace keel::parallel
