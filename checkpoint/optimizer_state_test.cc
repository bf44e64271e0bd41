#include "checkpoint/optimizer_state.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/torch_compat.h"
#include "checkpoint/state_dict.h"
#include "checkpoint/stateful_conformance_testutil.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/param_scheduler.h"
#include "parallel/layout.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/nn/modules/linear.h"
#include "torch/optim/adagrad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/lbfgs.h"
#include "torch/optim/rmsprop.h"
#include "torch/optim/sgd.h"

namespace keel::checkpoint {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StatefulConformanceTest;

struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(3, 4));
    b = register_module("b", torch::nn::Linear(4, 2));
  }
  torch::nn::Linear a{nullptr};
  torch::nn::Linear b{nullptr};
};

// Distinct parameter values derived from `base`.
void Fill(torch::nn::Module& module, double base) {
  at::NoGradGuard no_grad;
  double offset = base;
  for (auto& item : module.named_parameters()) {
    at::Tensor& t = item.value();
    t.copy_(at::arange(t.numel(), t.options()).reshape(t.sizes()) * 0.125 + offset);
    offset += 1;
  }
}

// Gradients that depend only on the parameters' values and the step, so two models with
// equal parameters get equal gradients. Parameters named in `skip` get none.
void SetGrads(torch::nn::Module& module, int step, const std::vector<std::string>& skip = {}) {
  for (auto& item : module.named_parameters()) {
    if (std::find(skip.begin(), skip.end(), item.key()) != skip.end()) continue;
    item.value().mutable_grad() = at::sin(item.value().detach() * (step + 1)) + 0.1 * step;
  }
}

void ExpectEqualParameters(torch::nn::Module& a, torch::nn::Module& b) {
  auto b_params = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    SCOPED_TRACE(item.key());
    EXPECT_TRUE(at::equal(item.value(), b_params[item.key()]));
  }
}

// Stands in for loading the model's parameters.
void CopyParameters(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto from_params = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(from_params[item.key()]);
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(Net&)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
};

// Two param groups, so per-group options are checked.
std::vector<torch::optim::OptimizerParamGroup> Groups(Net& net) {
  return {torch::optim::OptimizerParamGroup(net.a->parameters()),
          torch::optim::OptimizerParamGroup(net.b->parameters())};
}

void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

std::vector<OptimizerCase> Cases() {
  return {
      {"Adam",
       [](Net& net) {
         return std::make_unique<torch::optim::Adam>(
             Groups(net), torch::optim::AdamOptions(1e-2).weight_decay(0.1));
       }},
      {"AdamAmsgrad",
       [](Net& net) {
         return std::make_unique<torch::optim::Adam>(
             Groups(net), torch::optim::AdamOptions(1e-2).amsgrad(true).betas({0.8, 0.9}));
       }},
      {"AdamW",
       [](Net& net) {
         return std::make_unique<torch::optim::AdamW>(Groups(net),
                                                      torch::optim::AdamWOptions(1e-2));
       }},
      {"AdamWAmsgrad",
       [](Net& net) {
         return std::make_unique<torch::optim::AdamW>(
             Groups(net), torch::optim::AdamWOptions(1e-2).amsgrad(true).eps(1e-6));
       }},
      {"SgdMomentum",
       [](Net& net) {
         return std::make_unique<torch::optim::SGD>(
             Groups(net), torch::optim::SGDOptions(1e-2).momentum(0.9).dampening(0.1));
       }},
      {"SgdNesterov",
       [](Net& net) {
         return std::make_unique<torch::optim::SGD>(
             Groups(net),
             torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(0.01));
       }},
      {"SgdPlain",
       [](Net& net) {
         return std::make_unique<torch::optim::SGD>(Groups(net), torch::optim::SGDOptions(1e-2));
       }},
      {"Rmsprop",
       [](Net& net) {
         return std::make_unique<torch::optim::RMSprop>(
             Groups(net), torch::optim::RMSpropOptions(1e-2).weight_decay(0.1));
       }},
      {"RmspropMomentumCentered",
       [](Net& net) {
         return std::make_unique<torch::optim::RMSprop>(
             Groups(net),
             torch::optim::RMSpropOptions(1e-2).momentum(0.9).centered(true).alpha(0.9));
       }},
      {"Adagrad",
       [](Net& net) {
         return std::make_unique<torch::optim::Adagrad>(
             Groups(net),
             torch::optim::AdagradOptions(1e-2).lr_decay(0.01).initial_accumulator_value(0.1));
       }},
  };
}

using testing::LoadInMemory;

// Trains `net` for `steps` steps, then halves every group's learning rate, as a schedule
// would, so the saved options differ from a fresh optimizer's.
void Train(Net& net, torch::optim::Optimizer& optimizer, int steps) {
  for (int step = 0; step < steps; ++step) {
    SetGrads(net, step);
    optimizer.step();
  }
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(group.options().get_lr() * 0.5);
  }
}

// OptimizerState over each case's optimizer, with state from `variant` steps and a learning
// rate scaled by `variant`; and AdamW with its LR schedule. That schedule is at step 0 in every
// variant: Megatron's load_state_dict adds the saved steps to the current ones (the reference
// policy, param_scheduler.h), so only a scheduler that has not stepped ends where the saved one
// was.
class OptimizerStateUnderTest : public testing::StatefulUnderTest {
 public:
  OptimizerStateUnderTest(const MakeOptimizer& make, bool with_scheduler, int variant) {
    Fill(net_, variant);
    optimizer_ = make(net_);
    for (int step = 0; step < variant; ++step) {
      SetGrads(net_, step);
      optimizer_->step();
    }
    for (auto& group : optimizer_->param_groups()) {
      group.options().set_lr(group.options().get_lr() * variant);
    }
    if (with_scheduler) {
      optim::ParamSchedulerOptions options;
      options.max_lr = 1e-2;
      options.lr_warmup_steps = 2;
      options.lr_decay_steps = 10;
      scheduler_ = *optim::ParamScheduler::Create(options, *optimizer_);
    }
    state_ = *OptimizerState::Create(net_, *optimizer_, scheduler_ ? &*scheduler_ : nullptr);
  }
  Stateful& stateful() override { return *state_; }

 private:
  Net net_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<optim::ParamScheduler> scheduler_;
  std::optional<OptimizerState> state_;
};

std::vector<testing::StatefulCase> ConformanceCases() {
  std::vector<testing::StatefulCase> cases;
  for (const OptimizerCase& c : Cases()) {
    cases.push_back({c.name, [make = c.make](int variant) {
                       return std::make_unique<OptimizerStateUnderTest>(make, false, variant);
                     }});
  }
  cases.push_back({"AdamWWithScheduler", [](int variant) {
                     return std::make_unique<OptimizerStateUnderTest>(
                         [](Net& net) {
                           return std::make_unique<torch::optim::AdamW>(
                               Groups(net), torch::optim::AdamWOptions(1e-2));
                         },
                         true, variant);
                   }});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(OptimizerState, StatefulConformanceTest,
                         ::testing::ValuesIn(ConformanceCases()), testing::StatefulCaseName);

class OptimizerStateRoundTripTest : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerStateRoundTripTest, FreshOptimizerContinuesExactly) {
  Net source;
  Fill(source, 1);
  std::unique_ptr<torch::optim::Optimizer> source_optimizer = GetParam().make(source);
  Train(source, *source_optimizer, 3);

  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState source_state,
                            OptimizerState::Create(source, *source_optimizer));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved_optim, source_state.StateDict());
  std::map<std::string, State> saved;
  saved["optim"] = saved_optim;
  // The model's parameters, saved whole by name.
  for (const auto& item : source.named_parameters()) {
    saved["model"].tensors[item.key()] = TensorRef{item.value().detach()};
  }

  // A fresh model and optimizer; the optimizer has no state (Adagrad's, its initial
  // accumulators, which the load replaces).
  Net fresh;
  Fill(fresh, -5);
  std::unique_ptr<torch::optim::Optimizer> fresh_optimizer = GetParam().make(fresh);
  if (GetParam().name != "Adagrad") {
    ASSERT_TRUE(fresh_optimizer->state().empty());
  }
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState fresh_state,
                            OptimizerState::Create(fresh, *fresh_optimizer));

  // Loads the parameters in place, then the optimizer.
  struct Params : Stateful {
    torch::nn::Module* module;
    absl::StatusOr<State> StateDict() const override { return State(); }
    absl::Status LoadStateDict(StateReader& reader) override {
      for (auto& item : module->named_parameters()) {
        KEEL_RETURN_IF_ERROR(reader.ReadTensor(item.key(), TensorRef{item.value()}));
      }
      return absl::OkStatus();
    }
  } params;
  params.module = &fresh;
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"model", &params}, {"optim", &fresh_state}}, saved));
  EXPECT_TRUE(report.clean()) << report.ToString();

  EXPECT_EQ(fresh_optimizer->state().size(), source_optimizer->state().size());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(fresh_optimizer->param_groups()[i].options().get_lr(),
              source_optimizer->param_groups()[i].options().get_lr());
  }
  for (int step = 3; step < 5; ++step) {
    SetGrads(source, step);
    source_optimizer->step();
    SetGrads(fresh, step);
    fresh_optimizer->step();
    SCOPED_TRACE(absl::StrCat("after step ", step));
    ExpectEqualParameters(source, fresh);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerStateRoundTripTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(OptimizerStateTest, AdamLayoutIsKeyedByParameterName) {
  Net net;
  Fill(net, 1);
  torch::optim::Adam adam(Groups(net), torch::optim::AdamOptions(1e-2).amsgrad(true));
  for (int step = 0; step < 3; ++step) {
    SetGrads(net, step, /*skip=*/{"b.bias"});
    adam.step();
  }
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, adam));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, state.StateDict());

  std::vector<std::string> keys;
  for (const auto& [key, ref] : saved.tensors) keys.push_back(key);
  // b.bias never had a gradient, so Adam has no state for it.
  EXPECT_THAT(keys, ElementsAre("state/a.bias/exp_avg", "state/a.bias/exp_avg_sq",
                                "state/a.bias/max_exp_avg_sq", "state/a.weight/exp_avg",
                                "state/a.weight/exp_avg_sq", "state/a.weight/max_exp_avg_sq",
                                "state/b.weight/exp_avg", "state/b.weight/exp_avg_sq",
                                "state/b.weight/max_exp_avg_sq"));
  const auto& live = static_cast<const torch::optim::AdamParamState&>(
      *adam.state().at(base::OptimizerStateKeyOf(net.a->weight)));
  EXPECT_TRUE(saved.tensors["state/a.weight/exp_avg"].tensor.is_same(live.exp_avg()));

  const base::Json& v = saved.values;
  EXPECT_EQ(v["type"], "Adam");
  ASSERT_EQ(v["param_groups"].size(), 2);
  EXPECT_EQ(v["param_groups"][0]["params"], base::Json::array({"a.weight", "a.bias"}));
  EXPECT_EQ(v["param_groups"][1]["params"], base::Json::array({"b.weight", "b.bias"}));
  EXPECT_EQ(v["param_groups"][0]["lr"], 1e-2);
  EXPECT_EQ(v["param_groups"][0]["betas"], base::Json::array({0.9, 0.999}));
  EXPECT_EQ(v["param_groups"][0]["eps"], 1e-8);
  EXPECT_EQ(v["param_groups"][0]["weight_decay"], 0.0);
  EXPECT_EQ(v["param_groups"][0]["amsgrad"], true);
  // Three steps with a gradient each.
  EXPECT_EQ(v["state"]["a.weight"]["step"], 3);
  EXPECT_FALSE(v["state"].contains("b.bias"));
  EXPECT_FALSE(v.contains("sched"));
}

TEST(OptimizerStateTest, SgdLayoutHasOptionsAndMomentumBuffers) {
  Net net;
  Fill(net, 1);
  torch::optim::SGD sgd(
      Groups(net), torch::optim::SGDOptions(0.5).momentum(0.9).dampening(0.25).nesterov(false));
  SetGrads(net, 0);
  sgd.step();
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, sgd));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, state.StateDict());
  EXPECT_EQ(saved.tensors.count("state/b.bias/momentum_buffer"), 1);
  EXPECT_EQ(saved.tensors.size(), 4);
  const base::Json& group = saved.values["param_groups"][1];
  EXPECT_EQ(group["lr"], 0.5);
  EXPECT_EQ(group["momentum"], 0.9);
  EXPECT_EQ(group["dampening"], 0.25);
  EXPECT_EQ(group["weight_decay"], 0.0);
  EXPECT_EQ(group["nesterov"], false);
  EXPECT_EQ(saved.values["state"]["b.bias"], base::Json::object());
}

TEST(OptimizerStateTest, LoadReplacesExistingStateAndLeavesUnsavedParametersWithout) {
  Net source;
  Fill(source, 1);
  torch::optim::Adam source_adam(Groups(source), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 2; ++step) {
    SetGrads(source, step, /*skip=*/{"a.bias"});
    source_adam.step();
  }
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState source_state,
                            OptimizerState::Create(source, source_adam));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source_state.StateDict());

  // A target whose optimizer already has state for every parameter.
  Net target;
  Fill(target, 1);
  torch::optim::Adam target_adam(Groups(target), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 4; ++step) {
    SetGrads(target, step + 7);
    target_adam.step();
  }
  ASSERT_EQ(target_adam.state().size(), 4);
  CopyParameters(source, target);
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState target_state,
                            OptimizerState::Create(target, target_adam));
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"optim", &target_state}}, {{"optim", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  // a.bias had no saved state, so it has none now.
  EXPECT_EQ(target_adam.state().size(), 3);
  EXPECT_EQ(target_adam.state().count(base::OptimizerStateKeyOf(target.a->bias)), 0);
  const auto& loaded = static_cast<const torch::optim::AdamParamState&>(
      *target_adam.state().at(base::OptimizerStateKeyOf(target.a->weight)));
  EXPECT_EQ(loaded.step(), 2);
  EXPECT_TRUE(at::equal(loaded.exp_avg(), saved.tensors["state/a.weight/exp_avg"].tensor));
  // The loaded state is a copy, not the saved tensor.
  EXPECT_FALSE(loaded.exp_avg().is_alias_of(saved.tensors["state/a.weight/exp_avg"].tensor));

  for (int step = 2; step < 4; ++step) {
    SetGrads(source, step);
    source_adam.step();
    SetGrads(target, step);
    target_adam.step();
  }
  ExpectEqualParameters(source, target);
}

TEST(OptimizerStateTest, SchedulerStateRoundTrips) {
  optim::ParamSchedulerOptions options;
  options.max_lr = 1e-2;
  options.min_lr = 1e-4;
  options.lr_warmup_steps = 2;
  options.lr_decay_steps = 10;
  options.lr_decay_style = optim::LrDecayStyle::kCosine;
  options.start_wd = 0.01;
  options.end_wd = 0.01;

  Net source;
  Fill(source, 1);
  torch::optim::AdamW source_adamw(Groups(source), torch::optim::AdamWOptions(1e-2));
  KEEL_ASSERT_OK_AND_ASSIGN(optim::ParamScheduler source_sched,
                            optim::ParamScheduler::Create(options, source_adamw));
  for (int step = 0; step < 5; ++step) {
    SetGrads(source, step);
    source_adamw.step();
    KEEL_ASSERT_OK(source_sched.Step(1));
  }
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState source_state,
                            OptimizerState::Create(source, source_adamw, &source_sched));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, source_state.StateDict());
  EXPECT_EQ(saved.values["sched"]["num_steps"], 5);
  EXPECT_EQ(saved.values["sched"]["lr_decay_style"], "cosine");

  Net fresh;
  Fill(fresh, 1);
  torch::optim::AdamW fresh_adamw(Groups(fresh), torch::optim::AdamWOptions(1e-2));
  KEEL_ASSERT_OK_AND_ASSIGN(optim::ParamScheduler fresh_sched,
                            optim::ParamScheduler::Create(options, fresh_adamw));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState fresh_state,
                            OptimizerState::Create(fresh, fresh_adamw, &fresh_sched));
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"optim", &fresh_state}}, {{"optim", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  EXPECT_EQ(fresh_sched.num_steps(), 5);
  CopyParameters(source, fresh);
  EXPECT_EQ(fresh_adamw.param_groups()[0].options().get_lr(), source_sched.GetLr());

  for (int step = 5; step < 7; ++step) {
    SetGrads(source, step);
    source_adamw.step();
    KEEL_ASSERT_OK(source_sched.Step(1));
    SetGrads(fresh, step);
    fresh_adamw.step();
    KEEL_ASSERT_OK(fresh_sched.Step(1));
  }
  ExpectEqualParameters(source, fresh);

  // Without "sched" in the checkpoint, a strict load names it.
  saved.values.erase("sched");
  EXPECT_THAT(LoadInMemory({{"optim", &fresh_state}}, {{"optim", saved}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("sched")));
}

TEST(OptimizerStateTest, RejectsUnsupportedOptimizers) {
  Net net;
  torch::optim::LBFGS lbfgs(net.parameters());
  EXPECT_THAT(OptimizerState::Create(net, lbfgs),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("one of torch::optim::{Adam, AdamW, SGD, RMSprop, Adagrad}")));
}

TEST(OptimizerStateTest, RejectsParametersOutsideTheModel) {
  Net net;
  at::Tensor stray = at::zeros({5, 7}).set_requires_grad(true);
  torch::optim::SGD sgd(std::vector<at::Tensor>{net.a->weight, stray},
                        torch::optim::SGDOptions(1e-2));
  EXPECT_THAT(OptimizerState::Create(net, sgd),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("param_groups[0].params[1]"), HasSubstr("[5, 7]"))));
  torch::optim::SGD ok(net.parameters(), torch::optim::SGDOptions(1e-2));
  EXPECT_THAT(
      OptimizerState::Create(net, ok, nullptr, {{"a.nope", parallel::BlockLayout({1}, {0})}}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("a.nope")));
}

// Saves a stepped Adam over two groups.
State SavedAdam() {
  Net net;
  Fill(net, 1);
  torch::optim::Adam adam(Groups(net), torch::optim::AdamOptions(1e-2));
  SetGrads(net, 0);
  adam.step();
  absl::StatusOr<OptimizerState> state = OptimizerState::Create(net, adam);
  EXPECT_TRUE(state.ok());
  absl::StatusOr<State> saved = state->StateDict();
  EXPECT_TRUE(saved.ok());
  return *saved;
}

TEST(OptimizerStateTest, AnotherTypeIsAMismatchThatChangesNothing) {
  Net net;
  torch::optim::SGD sgd(Groups(net), torch::optim::SGDOptions(0.5).momentum(0.9));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, sgd));
  EXPECT_THAT(
      LoadInMemory({{"optim", &state}}, {{"optim", SavedAdam()}}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("type: Adam in the checkpoint, SGD here")));
  EXPECT_TRUE(sgd.state().empty());
  EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), 0.5);
}

// A param group here must hold parameters of the same saved group (a pipeline stage holds part
// of each); their order does not matter, the states go by name.
TEST(OptimizerStateTest, ParamGroupsMustMatchInCountAndMembership) {
  Net one_group_net;
  torch::optim::Adam one_group(one_group_net.parameters(), torch::optim::AdamOptions(0.5));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState one_state,
                            OptimizerState::Create(one_group_net, one_group));
  KEEL_ASSERT_OK_AND_ASSIGN(
      LoadReport report,
      LoadInMemory({{"optim", &one_state}}, {{"optim", SavedAdam()}}, /*strict=*/false));
  EXPECT_THAT(report.mismatches, ElementsAre("optim: param_groups: 2 in the checkpoint, 1 here"));
  EXPECT_TRUE(one_group.state().empty());
  EXPECT_EQ(one_group.param_groups()[0].options().get_lr(), 0.5);

  // Same count, other membership: a.bias moved to the second group.
  Net net;
  torch::optim::Adam moved(
      std::vector<torch::optim::OptimizerParamGroup>{
          torch::optim::OptimizerParamGroup({net.a->weight}),
          torch::optim::OptimizerParamGroup({net.a->bias, net.b->weight, net.b->bias})},
      torch::optim::AdamOptions(0.5));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState moved_state, OptimizerState::Create(net, moved));
  EXPECT_THAT(LoadInMemory({{"optim", &moved_state}}, {{"optim", SavedAdam()}}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("param_groups[1].params[0]: 'a.bias' is not in the checkpoint's "
                                 "(2 parameters)")));
  EXPECT_TRUE(moved.state().empty());

  // Same groups, another order: each state reaches its parameter by name.
  torch::optim::Adam swapped(
      std::vector<torch::optim::OptimizerParamGroup>{
          torch::optim::OptimizerParamGroup({net.a->bias, net.a->weight}),
          torch::optim::OptimizerParamGroup({net.b->weight, net.b->bias})},
      torch::optim::AdamOptions(0.5));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState swapped_state, OptimizerState::Create(net, swapped));
  KEEL_EXPECT_OK(LoadInMemory({{"optim", &swapped_state}}, {{"optim", SavedAdam()}}));
  const auto& state_of = [&](const at::Tensor& p) -> const torch::optim::AdamParamState& {
    return static_cast<const torch::optim::AdamParamState&>(
        *swapped.state().at(base::OptimizerStateKeyOf(p)));
  };
  EXPECT_EQ(state_of(net.a->bias).exp_avg().sizes(), net.a->bias.sizes());
  EXPECT_EQ(state_of(net.a->weight).exp_avg().sizes(), net.a->weight.sizes());
}

TEST(OptimizerStateTest, MissingOrMisshapedStateTensorsAreReportedAndNotInstalled) {
  State saved = SavedAdam();
  saved.tensors.erase("state/a.weight/exp_avg");
  saved.tensors["state/b.weight/exp_avg_sq"] = TensorRef{at::zeros({4, 2})};  // here: [2, 4]
  saved.values["param_groups"][0].erase("eps");

  Net net;
  torch::optim::Adam adam(Groups(net), torch::optim::AdamOptions(0.5));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state, OptimizerState::Create(net, adam));
  EXPECT_THAT(LoadInMemory({{"optim", &state}}, {{"optim", saved}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("param_groups[0].eps")));
  EXPECT_TRUE(adam.state().empty());

  saved.values["param_groups"][0]["eps"] = 1e-8;
  EXPECT_THAT(
      LoadInMemory({{"optim", &state}}, {{"optim", saved}}),
      StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("optim/state/a.weight/exp_avg"),
                                                   HasSubstr("optim/state/b.weight/exp_avg_sq"),
                                                   HasSubstr("[4, 2]"), HasSubstr("[2, 4]"))));
  // Non-strict: the two parameters whose state does not fit get none; the others get theirs.
  KEEL_ASSERT_OK_AND_ASSIGN(
      LoadReport report, LoadInMemory({{"optim", &state}}, {{"optim", saved}}, /*strict=*/false));
  EXPECT_THAT(report.missing_keys, ElementsAre("optim/state/a.weight/exp_avg"));
  EXPECT_EQ(adam.state().size(), 2);
  EXPECT_EQ(adam.state().count(base::OptimizerStateKeyOf(net.a->bias)), 1);
  EXPECT_EQ(adam.state().count(base::OptimizerStateKeyOf(net.b->bias)), 1);
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 1e-2);
}

TEST(OptimizerStateTest, ShardedParameterStateUsesTheParameterLayout) {
  Net source;
  Fill(source, 1);
  torch::optim::SGD sgd(Groups(source), torch::optim::SGDOptions(0.1).momentum(0.9));
  SetGrads(source, 0);
  sgd.step();
  // a.weight ([4, 3]) is rows [4, 8) of an [8, 3] parameter.
  const std::map<std::string, parallel::TensorLayout> layouts = {
      {"a.weight", parallel::BlockLayout({8, 3}, {4, 0})}};
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState state,
                            OptimizerState::Create(source, sgd, nullptr, layouts));
  KEEL_ASSERT_OK_AND_ASSIGN(State saved, state.StateDict());
  const TensorRef& buffer = saved.tensors["state/a.weight/momentum_buffer"];
  ASSERT_TRUE(buffer.layout.has_value());
  EXPECT_THAT(buffer.layout->global_shape, ElementsAre(8, 3));
  EXPECT_THAT(buffer.layout->offsets, ElementsAre(4, 0));
  EXPECT_FALSE(saved.tensors["state/a.bias/momentum_buffer"].layout.has_value());

  Net fresh;
  torch::optim::SGD fresh_sgd(Groups(fresh), torch::optim::SGDOptions(0.1).momentum(0.9));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerState fresh_state,
                            OptimizerState::Create(fresh, fresh_sgd, nullptr, layouts));
  KEEL_ASSERT_OK_AND_ASSIGN(LoadReport report,
                            LoadInMemory({{"optim", &fresh_state}}, {{"optim", saved}}));
  EXPECT_TRUE(report.clean()) << report.ToString();
  const auto& loaded = static_cast<const torch::optim::SGDParamState&>(
      *fresh_sgd.state().at(base::OptimizerStateKeyOf(fresh.a->weight)));
  EXPECT_TRUE(at::equal(loaded.momentum_buffer(), buffer.tensor));
}

}  // namespace
}  // namespace keel::checkpoint
