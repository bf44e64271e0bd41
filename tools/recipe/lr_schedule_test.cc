#include "tools/recipe/lr_schedule.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// NeMo AutoModel's LRSchedulerConfig.build: what the section leaves unset follows the
// optimizer's lr and weight decay.
TEST(ReadLrSchedulerTest, UnsetValuesFollowTheOptimizer) {
  optim::ParamSchedulerOptions schedule;
  DerivedLrSteps derived;
  KEEL_ASSERT_OK(ReadLrScheduler(LrSchedulerConfig(), 0.002, 0.05, schedule, derived));
  EXPECT_EQ(schedule.max_lr, 0.002);
  EXPECT_EQ(schedule.init_lr, 0.002 * 0.1);
  EXPECT_EQ(schedule.min_lr, 0.002 * 0.01);
  EXPECT_EQ(schedule.start_wd, 0.05);
  EXPECT_EQ(schedule.end_wd, 0.05);
  EXPECT_EQ(schedule.lr_decay_style, optim::LrDecayStyle::kCosine);
  EXPECT_TRUE(derived.lr_warmup_steps);
  EXPECT_TRUE(derived.lr_decay_steps);
  EXPECT_TRUE(derived.wd_incr_steps);
}

TEST(ReadLrSchedulerTest, SetFieldsWin) {
  LrSchedulerConfig config;
  config.set_init_lr(0);
  config.set_max_lr(0.5);
  config.set_min_lr(0.25);
  config.set_start_wd(0.125);
  config.set_end_wd(0.125);
  config.set_lr_warmup_steps(3);
  config.set_lr_decay_steps(7);
  config.set_wd_incr_steps(9);
  config.set_lr_decay_style("linear");
  optim::ParamSchedulerOptions schedule;
  DerivedLrSteps derived;
  KEEL_ASSERT_OK(ReadLrScheduler(config, 0.002, 0.05, schedule, derived));
  EXPECT_EQ(schedule.init_lr, 0);
  EXPECT_EQ(schedule.max_lr, 0.5);
  EXPECT_EQ(schedule.min_lr, 0.25);
  EXPECT_EQ(schedule.start_wd, 0.125);
  EXPECT_EQ(schedule.end_wd, 0.125);
  EXPECT_EQ(schedule.lr_decay_style, optim::LrDecayStyle::kLinear);
  EXPECT_FALSE(derived.lr_warmup_steps || derived.lr_decay_steps || derived.wd_incr_steps);
  const optim::ParamSchedulerOptions run = LrSchedule(schedule, derived, 1000);
  EXPECT_EQ(run.lr_warmup_steps, 3);
  EXPECT_EQ(run.lr_decay_steps, 7);
  EXPECT_EQ(run.wd_incr_steps, 9);
}

TEST(ReadLrSchedulerTest, ABadSpellingIsNamed) {
  LrSchedulerConfig config;
  config.set_lr_decay_style("sine");
  optim::ParamSchedulerOptions schedule;
  DerivedLrSteps derived;
  EXPECT_THAT(ReadLrScheduler(config, 0.002, 0.05, schedule, derived),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sine")));
}

// Unset step counts come from the run's length: decay over all of it, a tenth of it (at most
// 1000 steps) warming up.
TEST(LrScheduleTest, UnsetStepCountsFollowTheRunsLength) {
  const DerivedLrSteps all{.lr_warmup_steps = true, .lr_decay_steps = true, .wd_incr_steps = true};
  optim::ParamSchedulerOptions run = LrSchedule({}, all, 205);
  EXPECT_EQ(run.lr_warmup_steps, 20);
  EXPECT_EQ(run.lr_decay_steps, 205);
  EXPECT_EQ(run.wd_incr_steps, 205);
  run = LrSchedule({}, all, 50000);
  EXPECT_EQ(run.lr_warmup_steps, 1000);
  EXPECT_EQ(run.lr_decay_steps, 50000);
}

TEST(TotalStepsTest, TheFewerOfMaxStepsAndTheEpochs) {
  EXPECT_EQ(TotalSteps(200, 30, 5), 150);
  EXPECT_EQ(TotalSteps(100, 30, 5), 100);
  EXPECT_EQ(TotalSteps(100, std::nullopt, 5), 100);  // a source without a length
}

TEST(LrScheduleWarningsTest, APeakOfZeroAndAWarmUpThatOutlastsTheRun) {
  optim::ParamSchedulerOptions schedule;
  schedule.max_lr = 1e-3;
  schedule.lr_warmup_steps = 10;
  EXPECT_THAT(LrScheduleWarnings(schedule, 11), IsEmpty());
  // Step s trains at the schedule's step s - 1: with 10 steps the peak is never reached.
  EXPECT_THAT(LrScheduleWarnings(schedule, 10),
              ElementsAre(AllOf(HasSubstr("lr_scheduler.lr_warmup_steps (10)"),
                                HasSubstr("10 steps"), HasSubstr("never reaches"))));
  schedule.max_lr = 0;
  schedule.lr_warmup_steps = 0;
  EXPECT_THAT(LrScheduleWarnings(schedule, 10), ElementsAre(HasSubstr("peak learning rate is 0")));
}

}  // namespace
}  // namespace keel::tools::recipe
