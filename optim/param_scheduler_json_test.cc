#include "optim/internal/param_scheduler_json.h"

#include "base/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/param_scheduler.h"
#include "testing/status_matchers.h"

namespace keel::optim::internal {
namespace {

using ::absl::StatusCode;
using ::keel::base::Json;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParamSchedulerJsonTest, RoundTripsMegatronStateDict) {
  const Json dict = Json::parse(R"({"max_lr": 0.2, "lr_warmup_steps": 200, "num_steps": 500,
      "lr_decay_style": "cosine", "lr_decay_steps": 2000, "min_lr": 0.0005, "start_wd": 0.01,
      "end_wd": 0.2, "wd_incr_style": "cosine", "wd_incr_steps": 500})");
  KEEL_ASSERT_OK_AND_ASSIGN(ParamSchedulerState state, ParamSchedulerStateFromJson(dict));
  EXPECT_EQ(state.lr_decay_style, LrDecayStyle::kCosine);
  EXPECT_EQ(state.wd_incr_steps, 500);
  EXPECT_EQ(ParamSchedulerStateToJson(state), dict);  // same keys, values and order
}

TEST(ParamSchedulerJsonTest, LegacyKeysWinOverCurrentOnes) {
  const Json dict = Json::parse(R"({"start_lr": 0.3, "max_lr": 0.1, "min_lr": 0,
      "warmup_iter": 1, "warmup_steps": 2, "lr_warmup_steps": 3,
      "end_iter": 10, "decay_steps": 20, "lr_decay_steps": 30,
      "decay_style": "linear", "lr_decay_style": "cosine", "num_iters": 4, "num_steps": 5})");
  KEEL_ASSERT_OK_AND_ASSIGN(ParamSchedulerState state, ParamSchedulerStateFromJson(dict));
  EXPECT_EQ(state.max_lr, 0.3);
  EXPECT_EQ(state.lr_warmup_steps, 1);
  EXPECT_EQ(state.lr_decay_steps, 10);
  EXPECT_EQ(state.lr_decay_style, LrDecayStyle::kLinear);
  EXPECT_EQ(state.num_steps, 4);
  EXPECT_FALSE(state.start_wd.has_value());  // no start_wd: weight decay is not loaded

  const Json middle = Json::parse(R"({"max_lr": 0.1, "min_lr": 0, "warmup_steps": 2,
      "lr_warmup_steps": 3, "decay_steps": 20, "lr_decay_steps": 30, "lr_decay_style": "WSD",
      "num_steps": 5})");
  KEEL_ASSERT_OK_AND_ASSIGN(state, ParamSchedulerStateFromJson(middle));
  EXPECT_EQ(state.lr_warmup_steps, 2);
  EXPECT_EQ(state.lr_decay_steps, 20);
}

TEST(ParamSchedulerJsonTest, MissingOrBadKeysAreNamed) {
  EXPECT_THAT(ParamSchedulerStateFromJson(Json::parse(R"({"min_lr": 0})")),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("state_dict has none of the keys start_lr, max_lr")));
  EXPECT_THAT(ParamSchedulerStateFromJson(Json::parse(R"({"max_lr": 1, "min_lr": 0,
      "lr_warmup_steps": 0, "lr_decay_steps": 9, "lr_decay_style": "step", "num_steps": 0})")),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr(R"(state_dict.lr_decay_style: "step" is not one of)")));
  EXPECT_THAT(ParamSchedulerStateFromJson(Json::parse(R"({"max_lr": 1, "min_lr": 0,
      "lr_warmup_steps": 0, "lr_decay_steps": 9, "lr_decay_style": "linear", "num_steps": 0,
      "start_wd": 0.0})")),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("none of the keys end_wd")));
  EXPECT_THAT(ParamSchedulerStateFromJson(Json::array()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("must be a JSON object")));
}

}  // namespace
}  // namespace keel::optim::internal
