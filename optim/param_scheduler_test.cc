#include "optim/param_scheduler.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/optim/adamw.h"
#include "torch/optim/lbfgs.h"
#include "torch/optim/sgd.h"
#include "torch/types.h"

namespace keel::optim {
namespace {

using ::absl::StatusCode;
using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Warmup 0.0 -> 1.0 over 10 steps, then linear decay to 0.1 at step 100; weight decay
// linear from 0.0 to 0.1 over 100 steps.
ParamSchedulerOptions LinearOptions() {
  ParamSchedulerOptions o;
  o.init_lr = 0.0;
  o.max_lr = 1.0;
  o.min_lr = 0.1;
  o.lr_warmup_steps = 10;
  o.lr_decay_steps = 100;
  o.lr_decay_style = LrDecayStyle::kLinear;
  o.start_wd = 0.0;
  o.end_wd = 0.1;
  o.wd_incr_steps = 100;
  o.wd_incr_style = WdIncrStyle::kLinear;
  return o;
}

std::vector<torch::optim::OptimizerParamGroup> Groups(int n) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (int i = 0; i < n; ++i) groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({1})});
  return groups;
}

class ParamSchedulerTest : public ::testing::Test {
 protected:
  torch::optim::AdamW optimizer_{Groups(2), torch::optim::AdamWOptions(0.5)};

  double Lr(int group) { return optimizer_.param_groups()[group].options().get_lr(); }
  double Wd(int group) {
    return static_cast<torch::optim::AdamWOptions&>(optimizer_.param_groups()[group].options())
        .weight_decay();
  }
};

TEST_F(ParamSchedulerTest, CreateSetsStepZeroValuesOnEveryGroup) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  EXPECT_EQ(scheduler.num_steps(), 0);
  EXPECT_EQ(Lr(0), 0.0);  // init_lr
  EXPECT_EQ(Lr(1), 0.0);
  EXPECT_EQ(Wd(0), 0.0);  // start_wd
}

TEST_F(ParamSchedulerTest, WarmupThenLinearDecayThenMinLr) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  KEEL_ASSERT_OK(scheduler.Step(5));
  EXPECT_DOUBLE_EQ(Lr(0), 0.5);  // 0 + (1 - 0) * 5 / 10
  KEEL_ASSERT_OK(scheduler.Step(5));
  EXPECT_DOUBLE_EQ(Lr(0), 1.0);  // end of warmup: max_lr
  KEEL_ASSERT_OK(scheduler.Step(45));
  EXPECT_DOUBLE_EQ(Lr(0), 0.55);   // ratio 45/90 = 0.5: 0.1 + 0.5 * 0.9
  EXPECT_DOUBLE_EQ(Wd(0), 0.055);  // 55/100 of the way to 0.1
  KEEL_ASSERT_OK(scheduler.Step(45));
  EXPECT_DOUBLE_EQ(Lr(0), 0.1);  // step 100: min_lr exactly at the end of decay
  KEEL_ASSERT_OK(scheduler.Step(1));
  EXPECT_EQ(Lr(0), 0.1);  // past lr_decay_steps: min_lr
  EXPECT_EQ(Wd(0), 0.1);  // past wd_incr_steps: end_wd
}

TEST_F(ParamSchedulerTest, ANegativeIncrementIsAnErrorAndChangesNothing) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  KEEL_ASSERT_OK(scheduler.Step(5));
  EXPECT_THAT(scheduler.Step(-2), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("increment (-2) must be >= 0")));
  EXPECT_EQ(scheduler.num_steps(), 5);
  EXPECT_DOUBLE_EQ(Lr(0), 0.5);
}

TEST_F(ParamSchedulerTest, CosineIsHalfwayAtTheMidpoint) {
  ParamSchedulerOptions o = LinearOptions();
  o.lr_decay_style = LrDecayStyle::kCosine;
  o.wd_incr_style = WdIncrStyle::kCosine;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(o, optimizer_));
  KEEL_ASSERT_OK(scheduler.Step(55));
  EXPECT_NEAR(Lr(0), 0.55, 1e-15);  // cos(pi/2) = 0: coeff 0.5
  KEEL_ASSERT_OK(scheduler.Step(45));
  EXPECT_NEAR(Wd(0), 0.1, 1e-15);  // cosine increase ends at end_wd
}

TEST_F(ParamSchedulerTest, InverseSquareRootFallsAsOneOverSqrtStep) {
  ParamSchedulerOptions o = LinearOptions();
  o.lr_decay_style = LrDecayStyle::kInverseSquareRoot;
  o.lr_decay_steps = 1000;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(o, optimizer_));
  KEEL_ASSERT_OK(scheduler.Step(40));
  EXPECT_DOUBLE_EQ(Lr(0), 0.5);  // 1.0 * sqrt(10) / sqrt(40)
  KEEL_ASSERT_OK(scheduler.Step(960));
  EXPECT_DOUBLE_EQ(Lr(0), 0.1);  // sqrt(10/1000) = 0.1: equals min_lr
}

TEST_F(ParamSchedulerTest, WsdHoldsMaxLrThenAnnealsOverWsdDecaySteps) {
  ParamSchedulerOptions o = LinearOptions();
  o.lr_decay_style = LrDecayStyle::kWsd;
  o.wsd_decay_steps = 20;
  o.lr_wsd_decay_style = LrWsdDecayStyle::kLinear;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(o, optimizer_));
  KEEL_ASSERT_OK(scheduler.Step(80));
  EXPECT_EQ(Lr(0), 1.0);  // anneal starts after step 100 - 20 = 80
  KEEL_ASSERT_OK(scheduler.Step(10));
  EXPECT_DOUBLE_EQ(Lr(0), 0.55);  // halfway through the anneal
  o.lr_wsd_decay_style = LrWsdDecayStyle::kExponential;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler exponential, ParamScheduler::Create(o, optimizer_));
  KEEL_ASSERT_OK(exponential.Step(100));
  EXPECT_DOUBLE_EQ(Lr(0), 0.1);  // 2 * 0.5^1 - 1 = 0: min_lr
  o.lr_wsd_decay_style = LrWsdDecayStyle::kMinusSqrt;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler minus_sqrt, ParamScheduler::Create(o, optimizer_));
  KEEL_ASSERT_OK(minus_sqrt.Step(85));
  EXPECT_DOUBLE_EQ(Lr(0), 0.1 + 0.5 * 0.9);  // 1 - sqrt(5/20) = 0.5
}

TEST_F(ParamSchedulerTest, GroupOverridesAndMultipliersApplyPerGroup) {
  ParamGroupOverrides second;
  second.max_lr = 2.0;
  second.min_lr = 0.0;
  second.end_wd = 0.2;
  second.wd_mult = 0.5;
  second.lr_mult = 0.25;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_, {{}, second}));
  KEEL_ASSERT_OK(scheduler.Step(10));
  EXPECT_DOUBLE_EQ(Lr(0), 1.0);
  EXPECT_DOUBLE_EQ(Lr(1), 0.5);  // max_lr 2.0 times lr_mult 0.25
  EXPECT_DOUBLE_EQ(Wd(0), 0.01);
  EXPECT_DOUBLE_EQ(Wd(1), 0.01);                   // 10/100 of 0.2, times wd_mult 0.5
  EXPECT_DOUBLE_EQ(scheduler.GetLr(second), 2.0);  // get_lr: no multiplier
  EXPECT_DOUBLE_EQ(scheduler.GetWd(second), 0.02);
}

TEST(ParamSchedulerOptimizerTest, SetsWeightDecayWhereTheOptionsHaveOne) {
  torch::optim::SGD sgd(Groups(1), torch::optim::SGDOptions(0.1));
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler on_sgd, ParamScheduler::Create(LinearOptions(), sgd));
  KEEL_ASSERT_OK(on_sgd.Step(50));
  const auto& sgd_options = static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(sgd_options.weight_decay(), 0.05);

  torch::optim::LBFGS lbfgs(std::vector<torch::Tensor>{torch::zeros({1})});
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler on_lbfgs,
                            ParamScheduler::Create(LinearOptions(), lbfgs));
  KEEL_ASSERT_OK(on_lbfgs.Step(10));
  EXPECT_DOUBLE_EQ(lbfgs.param_groups()[0].options().get_lr(), 1.0);  // no weight decay to set
}

TEST_F(ParamSchedulerTest, GroupsAddedAfterCreateUseTheDefaults) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  optimizer_.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({1})}));
  KEEL_ASSERT_OK(scheduler.Step(10));
  EXPECT_DOUBLE_EQ(optimizer_.param_groups()[2].options().get_lr(), 1.0);
}

struct RejectCase {
  const char* name;
  void (*mutate)(ParamSchedulerOptions&);
  const char* message;
};

TEST(ParamSchedulerValidationTest, RejectsEveryInputMegatronRejects) {
  const RejectCase cases[] = {
      {"negative min_lr", [](ParamSchedulerOptions& o) { o.min_lr = -0.1; },
       "min_lr (-0.1) must be >= 0"},
      {"NaN min_lr", [](ParamSchedulerOptions& o) { o.min_lr = std::nan(""); },
       "min_lr (nan) must be >= 0"},
      {"max below min", [](ParamSchedulerOptions& o) { o.max_lr = 0.05; },
       "max_lr (0.05) must be >= min_lr (0.1)"},
      {"init above max", [](ParamSchedulerOptions& o) { o.init_lr = 2.0; },
       "init_lr (2) must be <= max_lr (1)"},
      {"zero decay steps", [](ParamSchedulerOptions& o) { o.lr_decay_steps = 0; },
       "lr_decay_steps (0) must be > 0"},
      {"warmup not below decay", [](ParamSchedulerOptions& o) { o.lr_warmup_steps = 100; },
       "lr_warmup_steps (100) must be < lr_decay_steps (100)"},
      {"WSD without steps",
       [](ParamSchedulerOptions& o) {
         o.lr_decay_style = LrDecayStyle::kWsd;
         o.lr_wsd_decay_style = LrWsdDecayStyle::kLinear;
       },
       "wsd_decay_steps is required"},
      {"WSD without style",
       [](ParamSchedulerOptions& o) {
         o.lr_decay_style = LrDecayStyle::kWsd;
         o.wsd_decay_steps = 10;
       },
       "lr_wsd_decay_style is required"},
      {"negative start_wd", [](ParamSchedulerOptions& o) { o.start_wd = -1.0; },
       "start_wd (-1) must be >= 0"},
      {"end below start", [](ParamSchedulerOptions& o) { o.start_wd = 0.2; },
       "end_wd (0.1) must be >= start_wd (0.2)"},
      {"override and use-checkpoint",
       [](ParamSchedulerOptions& o) { o.override_opt_param_scheduler = true; },
       "both override_opt_param_scheduler and use_checkpoint_opt_param_scheduler are set"},
      {"constant wd with start != end",
       [](ParamSchedulerOptions& o) { o.wd_incr_style = WdIncrStyle::kConstant; },
       "start_wd (0) must equal end_wd (0.1) when wd_incr_style is \"constant\""},
      {"zero wd_incr_steps", [](ParamSchedulerOptions& o) { o.wd_incr_steps = 0; },
       "wd_incr_steps (0) must be non-zero when wd_incr_style is \"linear\""},
  };
  torch::optim::AdamW optimizer(Groups(1), torch::optim::AdamWOptions());
  for (const RejectCase& c : cases) {
    SCOPED_TRACE(c.name);
    ParamSchedulerOptions o = LinearOptions();
    c.mutate(o);
    EXPECT_THAT(Validate(o), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(ParamScheduler::Create(o, optimizer),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(ParamSchedulerValidationTest, RejectsBadGroupOverrides) {
  torch::optim::AdamW optimizer(Groups(2), torch::optim::AdamWOptions());
  ParamSchedulerOptions o = LinearOptions();
  o.wd_incr_style = WdIncrStyle::kConstant;
  o.start_wd = 0.1;
  ParamGroupOverrides uneven;
  uneven.start_wd = 0.0;
  EXPECT_THAT(ParamScheduler::Create(o, optimizer, {{}, uneven}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("param group 1: start_wd (0) must equal end_wd (0.1)")));
  EXPECT_THAT(ParamScheduler::Create(o, optimizer, {{}, {}, {}}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("group_overrides has 3 entries but the optimizer has 2")));
}

TEST(ParamSchedulerStyleTest, ParsesExactlyTheReferenceSpellings) {
  LrDecayStyle lr;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("inverse-square-root", &lr, &error));
  EXPECT_EQ(lr, LrDecayStyle::kInverseSquareRoot);
  EXPECT_TRUE(AbslParseFlag("WSD", &lr, &error));
  EXPECT_EQ(AbslUnparseFlag(lr), "WSD");
  EXPECT_FALSE(AbslParseFlag("wsd", &lr, &error));
  EXPECT_EQ(error,
            R"("wsd" is not one of "constant", "linear", "cosine", "inverse-square-root", "WSD")");
  WdIncrStyle wd;
  EXPECT_FALSE(AbslParseFlag("exponential", &wd, &error));
  EXPECT_THAT(error, HasSubstr(R"("constant", "linear", "cosine")"));
  LrWsdDecayStyle wsd;
  EXPECT_TRUE(AbslParseFlag("minus_sqrt", &wsd, &error));
  EXPECT_EQ(AbslUnparseFlag(wsd), "minus_sqrt");
  SchedulerLoadPolicy policy;
  EXPECT_TRUE(AbslParseFlag("corrected", &policy, &error));
  EXPECT_EQ(AbslUnparseFlag(policy), "corrected");
  EXPECT_FALSE(AbslParseFlag("fixed", &policy, &error));
  EXPECT_EQ(error, R"("fixed" is not one of "reference", "corrected")");
}

TEST_F(ParamSchedulerTest, StateDictRoundTripResumesTheExactTrace) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler first,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  KEEL_ASSERT_OK(first.Step(37));
  const ParamSchedulerState state = first.StateDict();
  EXPECT_EQ(state.num_steps, 37);
  EXPECT_EQ(state.wd_incr_style, WdIncrStyle::kLinear);
  KEEL_ASSERT_OK(first.Step(1));
  const double lr_38 = Lr(0);
  const double wd_38 = Wd(0);

  torch::optim::AdamW fresh(Groups(2), torch::optim::AdamWOptions());
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler resumed, ParamScheduler::Create(LinearOptions(), fresh));
  KEEL_ASSERT_OK(resumed.LoadStateDict(state));
  KEEL_ASSERT_OK(resumed.Step(1));
  EXPECT_EQ(fresh.param_groups()[0].options().get_lr(), lr_38);
  EXPECT_EQ(
      static_cast<torch::optim::AdamWOptions&>(fresh.param_groups()[0].options()).weight_decay(),
      wd_38);
}

TEST_F(ParamSchedulerTest, LoadAddsToStepsAlreadyTakenAsMegatronDoes) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.num_steps = 20;
  KEEL_ASSERT_OK(scheduler.Step(5));
  KEEL_ASSERT_OK(scheduler.LoadStateDict(state));
  EXPECT_EQ(scheduler.num_steps(), 25);
}

TEST_F(ParamSchedulerTest, LoadedWeightDecayFieldsTakeEffectAtTheNextStep) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.num_steps = 50;
  state.end_wd = 0.3;
  KEEL_ASSERT_OK(scheduler.LoadStateDict(state));
  EXPECT_DOUBLE_EQ(Wd(0), 0.05);  // computed with the old end_wd 0.1
  KEEL_ASSERT_OK(scheduler.Step(0));
  EXPECT_DOUBLE_EQ(Wd(0), 0.15);  // now with the loaded end_wd 0.3
}

TEST_F(ParamSchedulerTest, CorrectedLoadLandsOnTheCheckpointStepWithItsWholeSchedule) {
  ParamSchedulerOptions options = LinearOptions();
  options.load_policy = SchedulerLoadPolicy::kCorrected;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(options, optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.num_steps = 50;
  state.max_lr = 2.0;
  state.end_wd = 0.3;
  KEEL_ASSERT_OK(scheduler.Step(5));  // steps already taken do not count
  KEEL_ASSERT_OK(scheduler.LoadStateDict(state));
  EXPECT_EQ(scheduler.num_steps(), 50);
  // Linear warmup ends at 10; at 50 the lr is 2.0 - (2.0 - 0.1) * 40 / 90 and the weight
  // decay 0.3 * 50 / 100, both from the checkpoint's fields at once.
  EXPECT_DOUBLE_EQ(Lr(1), 2.0 - 1.9 * 40.0 / 90.0);
  EXPECT_DOUBLE_EQ(Wd(1), 0.15);
  EXPECT_EQ(scheduler.options().max_lr, 2.0);
  EXPECT_EQ(scheduler.options().end_wd, 0.3);
  EXPECT_EQ(scheduler.options().load_policy, SchedulerLoadPolicy::kCorrected);
}

TEST_F(ParamSchedulerTest, BothLoadPoliciesAgreeOnAnUnchangedResumeIntoAFreshScheduler) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler first,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  KEEL_ASSERT_OK(first.Step(37));
  const ParamSchedulerState state = first.StateDict();
  for (SchedulerLoadPolicy policy :
       {SchedulerLoadPolicy::kReference, SchedulerLoadPolicy::kCorrected}) {
    SCOPED_TRACE(AbslUnparseFlag(policy));
    ParamSchedulerOptions options = LinearOptions();
    options.load_policy = policy;
    torch::optim::AdamW fresh(Groups(2), torch::optim::AdamWOptions());
    KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler resumed, ParamScheduler::Create(options, fresh));
    KEEL_ASSERT_OK(resumed.LoadStateDict(state));
    EXPECT_EQ(resumed.num_steps(), 37);
    EXPECT_EQ(fresh.param_groups()[0].options().get_lr(), Lr(0));
    EXPECT_EQ(
        static_cast<torch::optim::AdamWOptions&>(fresh.param_groups()[0].options()).weight_decay(),
        Wd(0));
  }
}

TEST_F(ParamSchedulerTest, OnlyTheReferenceLoadLeavesTheOldWeightDecayUntilTheNextStep) {
  // The configured weight decay is constant 0.1; the checkpoint's rises linearly to 0.2 over 10
  // steps, so at its step 3 it is 0.13.
  ParamSchedulerOptions options = LinearOptions();
  options.wd_incr_style = WdIncrStyle::kConstant;
  options.start_wd = 0.1;
  options.end_wd = 0.1;
  for (SchedulerLoadPolicy policy :
       {SchedulerLoadPolicy::kReference, SchedulerLoadPolicy::kCorrected}) {
    SCOPED_TRACE(AbslUnparseFlag(policy));
    options.load_policy = policy;
    torch::optim::AdamW optimizer(Groups(1), torch::optim::AdamWOptions());
    KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(options, optimizer));
    ParamSchedulerState state = scheduler.StateDict();
    state.num_steps = 3;
    state.end_wd = 0.2;
    state.wd_incr_style = WdIncrStyle::kLinear;
    state.wd_incr_steps = 10;
    KEEL_ASSERT_OK(scheduler.LoadStateDict(state));
    auto& group = static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options());
    EXPECT_DOUBLE_EQ(group.weight_decay(), policy == SchedulerLoadPolicy::kCorrected ? 0.13 : 0.1);
    KEEL_ASSERT_OK(scheduler.Step(0));
    EXPECT_DOUBLE_EQ(group.weight_decay(), 0.13);
  }
}

TEST_F(ParamSchedulerTest, LoadWithoutWeightDecayFieldsKeepsTheConfiguredOnes) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.start_wd.reset();
  state.end_wd.reset();
  state.wd_incr_steps.reset();
  state.wd_incr_style.reset();
  KEEL_ASSERT_OK(scheduler.LoadStateDict(state));
  EXPECT_EQ(scheduler.options().end_wd, 0.1);
  state.end_wd = 0.2;  // one of four
  EXPECT_THAT(scheduler.LoadStateDict(state),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("all present or all absent")));
}

TEST_F(ParamSchedulerTest, LoadPolicyUseCheckpointOverrideOrRequireEqual) {
  ParamSchedulerOptions strict = LinearOptions();
  strict.use_checkpoint_opt_param_scheduler = false;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler, ParamScheduler::Create(strict, optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.lr_warmup_steps = 20;
  state.num_steps = 7;
  EXPECT_THAT(
      scheduler.LoadStateDict(state),
      StatusIs(StatusCode::kInvalidArgument,
               AllOf(HasSubstr("lr_warmup_steps is 10 in the scheduler but 20 in the checkpoint"),
                     HasSubstr("use_checkpoint_opt_param_scheduler"))));
  EXPECT_EQ(scheduler.num_steps(), 0);  // nothing changed

  ParamSchedulerOptions keep = strict;
  keep.override_opt_param_scheduler = true;
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler overriding, ParamScheduler::Create(keep, optimizer_));
  KEEL_ASSERT_OK(overriding.LoadStateDict(state));
  EXPECT_EQ(overriding.options().lr_warmup_steps, 10);
  EXPECT_EQ(overriding.num_steps(), 7);  // num_steps always comes from the checkpoint

  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler taking,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  KEEL_ASSERT_OK(taking.LoadStateDict(state));
  EXPECT_EQ(taking.options().lr_warmup_steps, 20);
}

TEST_F(ParamSchedulerTest, LoadRejectsAnInvalidResultingScheduleAndNegativeSteps) {
  KEEL_ASSERT_OK_AND_ASSIGN(ParamScheduler scheduler,
                            ParamScheduler::Create(LinearOptions(), optimizer_));
  ParamSchedulerState state = scheduler.StateDict();
  state.lr_warmup_steps = 500;
  EXPECT_THAT(scheduler.LoadStateDict(state),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("loaded schedule is invalid: lr_warmup_steps (500) must be < "
                                 "lr_decay_steps (100)")));
  state = scheduler.StateDict();
  state.num_steps = -1;
  EXPECT_THAT(scheduler.LoadStateDict(state),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("num_steps (-1) must be >= 0")));
}

}  // namespace
}  // namespace keel::optim
