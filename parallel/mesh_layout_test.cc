#include "parallel/mesh_layout.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::parallel {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

ModelParallelOptions Sizes(int64_t tp, int64_t pp, int64_t cp = 1, int64_t ep = 1) {
  ModelParallelOptions options;
  options.tensor_model_parallel_size = tp;
  options.pipeline_model_parallel_size = pp;
  options.context_parallel_size = cp;
  options.expert_model_parallel_size = ep;
  return options;
}

TEST(GroupKindTest, ParsesExactlyMegatronsTokensAndNamesThemBack) {
  const std::vector<std::string> tokens = {"dp-cp",     "dp",    "cp",        "tp-pp",
                                           "tp",        "pp",    "embedding", "position_embedding",
                                           "tp-dp-cp",  "tp-dp", "tp-cp",     "ep",
                                           "expert_tp", "tp-ep", "tp-ep-pp",  "expert_dp"};
  ASSERT_EQ(tokens.size(), kGroupKinds.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    SCOPED_TRACE(tokens[i]);
    KEEL_ASSERT_OK_AND_ASSIGN(const GroupKind kind, ParseGroupKind(tokens[i]));
    EXPECT_EQ(kind, kGroupKinds[i]);
    EXPECT_EQ(GroupKindName(kind), tokens[i]);
  }
  EXPECT_THAT(ParseGroupKind("TP"), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("\"TP\" is not one of \"dp-cp\", \"dp\"")));
  EXPECT_THAT(ParseGroupKind("dp_cp"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"expert_dp\"")));
}

// The example of initialize_model_parallel's docstring: 16 ranks, tp 2, pp 4, so dp 2.
TEST(MeshLayoutTest, MatchesMegatronsDocstringExample) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(Sizes(2, 4), 16));
  EXPECT_EQ(layout.data_parallel_size(), 2);
  EXPECT_EQ(layout.Groups(GroupKind::kDp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(layout.Groups(GroupKind::kTp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(layout.Groups(GroupKind::kPp),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  // First and last stage of each pipeline; the first alone.
  EXPECT_EQ(layout.Groups(GroupKind::kEmbedding), (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(layout.Groups(GroupKind::kPositionEmbedding), (Groups{{0}, {1}, {2}, {3}}));
}

// generate_masked_orthogonal_rank_groups' docstring: sizes [tp 2, dp 3, pp 4] in order
// tp-dp-pp; dp group g holds tp_rank + 2 * dp_rank + 6 * pp_rank for dp_rank 0..2.
TEST(MeshLayoutTest, MatchesTheRankGeneratorsDocstringExample) {
  ModelParallelOptions options = Sizes(2, 4);
  options.order = "tp-dp-pp";
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(options, 24));
  const Groups& dp = layout.Groups(GroupKind::kDp);
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

// World 8, tp 2, pp 2 in the default order: rank = tp + 2 * dp + 4 * pp.
TEST(MeshLayoutTest, DenseGroupsAndCoordinates) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(Sizes(2, 2), 8));
  EXPECT_EQ(layout.Groups(GroupKind::kTpPp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kTpDp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kDpCp), layout.Groups(GroupKind::kDp));
  EXPECT_EQ(layout.Groups(GroupKind::kCp).size(), 8u);
  // Rank 5 = tp 1 + 2 * dp 0 + 4 * pp 1.
  EXPECT_EQ(layout.Coordinate(GroupKind::kTp, 5), 1);
  EXPECT_EQ(layout.Coordinate(GroupKind::kDp, 5), 0);
  EXPECT_EQ(layout.Coordinate(GroupKind::kPp, 5), 1);
  EXPECT_EQ(layout.Coordinate(GroupKind::kTpPp, 5), 3);  // [1, 5] sits in [0, 1, 4, 5]
  EXPECT_EQ(layout.Coordinate(GroupKind::kEmbedding, 5), 1);
  EXPECT_EQ(layout.Coordinate(GroupKind::kPositionEmbedding, 5), std::nullopt);  // last stage
  EXPECT_EQ(layout.GroupIndex(GroupKind::kDp, 5), 3);
  EXPECT_EQ(layout.GroupIndex(GroupKind::kDp, 8), std::nullopt);
  EXPECT_EQ(layout.Coordinate(GroupKind::kDp, -1), std::nullopt);
}

// World 8, tp 2, ep 4, expert tp 1: dense dp 4; expert grid ep 4 x expert dp 2, ep fastest.
TEST(MeshLayoutTest, ExpertGridUsesItsOwnTensorParallelSize) {
  ModelParallelOptions options = Sizes(2, 1, 1, 4);
  options.expert_tensor_parallel_size = 1;
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(options, 8));
  EXPECT_EQ(layout.data_parallel_size(), 4);
  EXPECT_EQ(layout.expert_tensor_parallel_size(), 1);
  EXPECT_EQ(layout.expert_data_parallel_size(), 2);
  EXPECT_EQ(layout.Groups(GroupKind::kEp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kExpertDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kExpertTp).size(), 8u);
  EXPECT_EQ(layout.Groups(GroupKind::kTp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.Coordinate(GroupKind::kEp, 6), 2);
  EXPECT_EQ(layout.Coordinate(GroupKind::kExpertDp, 6), 1);
}

TEST(MeshLayoutTest, ExpertTensorParallelSizeDefaultsToTheDenseOne) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(Sizes(2, 1, 1, 2), 8));
  EXPECT_EQ(layout.expert_tensor_parallel_size(), 2);
  EXPECT_EQ(layout.expert_data_parallel_size(), 2);  // 8 / (2 x 2 x 1)
  EXPECT_EQ(layout.Groups(GroupKind::kTpEp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kTpEpPp), layout.Groups(GroupKind::kTpEp));
}

TEST(MeshLayoutTest, OddWorldIsAllDataParallel) {
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create({}, 3));
  EXPECT_EQ(layout.data_parallel_size(), 3);
  EXPECT_EQ(layout.Groups(GroupKind::kDp), (Groups{{0, 1, 2}}));
  EXPECT_EQ(layout.Groups(GroupKind::kTp), (Groups{{0}, {1}, {2}}));
  EXPECT_EQ(layout.Coordinate(GroupKind::kTpDpCp, 2), 2);
}

// An axis of size 1 may be left out of the order (it changes no group).
TEST(MeshLayoutTest, OrderMayLeaveOutAxesOfSizeOne) {
  ModelParallelOptions options = Sizes(2, 2);
  options.order = "tp-pp-dp";
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout layout, MeshLayout::Create(options, 8));
  EXPECT_EQ(layout.Groups(GroupKind::kPp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.Groups(GroupKind::kDp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(MeshLayoutTest, VirtualPipelineSizeChangesNoGroup) {
  ModelParallelOptions options = Sizes(1, 2);
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout plain, MeshLayout::Create(options, 4));
  options.virtual_pipeline_model_parallel_size = 3;
  KEEL_ASSERT_OK_AND_ASSIGN(const MeshLayout virtual_pp, MeshLayout::Create(options, 4));
  for (GroupKind kind : kGroupKinds) {
    EXPECT_EQ(plain.Groups(kind), virtual_pp.Groups(kind)) << GroupKindName(kind);
  }
}

struct InvalidCase {
  std::string name;
  ModelParallelOptions options;
  int world_size;
  std::string message;
};

std::vector<InvalidCase> InvalidCases() {
  auto with = [](ModelParallelOptions o, auto&& edit) {
    edit(o);
    return o;
  };
  using O = ModelParallelOptions&;
  return {
      {"world_size", {}, 0, "world_size (0) must be >= 1"},
      {"tp", Sizes(0, 1), 8, "tensor_model_parallel_size (0) must be >= 1"},
      {"pp", Sizes(1, -1), 8, "pipeline_model_parallel_size (-1) must be >= 1"},
      {"cp", Sizes(1, 1, 0), 8, "context_parallel_size (0) must be >= 1"},
      {"ep", Sizes(1, 1, 1, 0), 8, "expert_model_parallel_size (0) must be >= 1"},
      {"etp", with({}, [](O o) { o.expert_tensor_parallel_size = 0; }), 8,
       "expert_tensor_parallel_size (0) must be >= 1"},
      {"vpp", with(Sizes(1, 2), [](O o) { o.virtual_pipeline_model_parallel_size = 0; }), 8,
       "virtual_pipeline_model_parallel_size (0) must be >= 1"},
      {"not_divisible", Sizes(4, 1), 6,
       "world_size (6) is not divisible by tensor_model_parallel_size (4) x "
       "pipeline_model_parallel_size (1) x context_parallel_size (1) = 4"},
      {"product_exceeds_world", Sizes(4, 4, 4), 8,
       "pipeline_model_parallel_size (4) x context_parallel_size (4), whose product exceeds it"},
      {"huge_sizes_do_not_overflow", Sizes(int64_t{1} << 40, int64_t{1} << 40), 8,
       "whose product exceeds it"},
      {"vpp_without_pp", with({}, [](O o) { o.virtual_pipeline_model_parallel_size = 2; }), 8,
       "virtual_pipeline_model_parallel_size (2) needs pipeline_model_parallel_size > 1"},
      {"upper_case_token", with({}, [](O o) { o.order = "TP-CP-EP-DP-PP"; }), 8,
       "order \"TP-CP-EP-DP-PP\": token \"TP\" is not one of \"tp\", \"cp\", \"ep\", \"dp\", "
       "\"pp\""},
      {"empty_token", with({}, [](O o) { o.order = "tp-dp-pp-"; }), 8,
       "order \"tp-dp-pp-\": token \"\" is not one of"},
      {"empty_order", with({}, [](O o) { o.order = ""; }), 8, "order \"\": token \"\""},
      {"token_twice", with({}, [](O o) { o.order = "tp-dp-dp-pp"; }), 8,
       "order \"tp-dp-dp-pp\" names dp twice"},
      {"no_tp", with({}, [](O o) { o.order = "cp-ep-dp-pp"; }), 4,
       "order \"cp-ep-dp-pp\" does not name tp"},
      {"dense_axis_unnamed", with(Sizes(1, 1, 2), [](O o) { o.order = "tp-dp-pp"; }), 8,
       "order \"tp-dp-pp\" does not name cp, whose size is 2 (context_parallel_size)"},
      {"data_parallel_axis_unnamed", with(Sizes(2, 2), [](O o) { o.order = "tp-pp"; }), 8,
       "does not name dp, whose size is 2 (data_parallel_size)"},
      {"expert_axis_unnamed", with(Sizes(1, 1, 1, 2), [](O o) { o.order = "tp-dp-pp"; }), 8,
       "does not name ep, whose size is 2 (expert_model_parallel_size)"},
      {"expert_not_divisible", Sizes(2, 1, 1, 3), 8,
       "world_size (8) is not divisible by expert_tensor_parallel_size (2) x "
       "expert_model_parallel_size (3) x pipeline_model_parallel_size (1) = 6"},
      {"pp_not_last_unequal_dp",
       with(Sizes(2, 2),
            [](O o) {
              o.expert_tensor_parallel_size = 1;
              o.order = "tp-pp-dp";
            }),
       8,
       "order \"tp-pp-dp\" does not end with pp and pipeline_model_parallel_size is 2, so the "
       "data-parallel sizes of the dense layers (2) and of the experts (4) must be equal"},
      {"different_pipelines", with(Sizes(1, 2, 2, 2), [](O o) { o.order = "tp-cp-pp-ep-dp"; }), 8,
       "different pipeline groups: group 0 is [0, 2] for the dense layers and [0, 1] for the "
       "experts"},
  };
}

TEST(MeshLayoutTest, RefusesEveryInvalidLayoutNamingTheValues) {
  for (const InvalidCase& c : InvalidCases()) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(MeshLayout::Create(c.options, c.world_size),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

}  // namespace
}  // namespace keel::parallel
