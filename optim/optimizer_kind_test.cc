#include "optim/optimizer_kind.h"

#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/optim/adagrad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/lbfgs.h"
#include "torch/optim/rmsprop.h"
#include "torch/optim/sgd.h"

namespace keel::optim {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<at::Tensor> Params() { return {at::zeros({2}).requires_grad_(true)}; }

// The weight decay the group's options now hold, read through their own type.
template <typename O>
double WeightDecayOf(torch::optim::Optimizer& optimizer) {
  return static_cast<O&>(optimizer.param_groups()[0].options()).weight_decay();
}

TEST(OptimizerKindTest, EachKnownOptimizerHasItsKindNameAndWeightDecay) {
  torch::optim::Adam adam(Params());
  torch::optim::AdamW adamw(Params());
  torch::optim::SGD sgd(Params(), torch::optim::SGDOptions(0.1));
  torch::optim::RMSprop rmsprop(Params());
  torch::optim::Adagrad adagrad(Params());
  struct Case {
    torch::optim::Optimizer* optimizer;
    OptimizerKind kind;
    std::string name;
    double (*weight_decay)(torch::optim::Optimizer&);
  };
  const std::vector<Case> cases = {
      {&adam, OptimizerKind::kAdam, "Adam", &WeightDecayOf<torch::optim::AdamOptions>},
      {&adamw, OptimizerKind::kAdamW, "AdamW", &WeightDecayOf<torch::optim::AdamWOptions>},
      {&sgd, OptimizerKind::kSgd, "SGD", &WeightDecayOf<torch::optim::SGDOptions>},
      {&rmsprop, OptimizerKind::kRmsprop, "RMSprop", &WeightDecayOf<torch::optim::RMSpropOptions>},
      {&adagrad, OptimizerKind::kAdagrad, "Adagrad", &WeightDecayOf<torch::optim::AdagradOptions>},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KEEL_ASSERT_OK_AND_ASSIGN(OptimizerKind kind, KindOf(*c.optimizer));
    EXPECT_EQ(kind, c.kind);
    EXPECT_EQ(OptimizerKindName(kind), c.name);
    SetWeightDecay(kind, c.optimizer->param_groups()[0].options(), 0.25);
    EXPECT_EQ(c.weight_decay(*c.optimizer), 0.25);
  }
}

TEST(OptimizerKindTest, OtherOptimizersAreRefusedListingTheKnownOnes) {
  torch::optim::LBFGS lbfgs(Params());
  EXPECT_THAT(KindOf(lbfgs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("one of torch::optim::{Adam, AdamW, SGD, RMSprop, Adagrad}")));
}

}  // namespace
}  // namespace keel::optim
