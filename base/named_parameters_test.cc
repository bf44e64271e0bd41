#include "base/named_parameters.h"

#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/nn/module.h"

namespace keel::base {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// An embedding, a layer whose weight is a view of the embedding's storage (a different
// tensor), and a head registering the embedding's tensor itself.
struct Head : torch::nn::Module {
  explicit Head(const at::Tensor& w) { register_parameter("weight", w); }
};
struct Tied : torch::nn::Module {
  Tied() {
    wte = register_parameter("wte", at::zeros({4, 2}));
    view = register_parameter("view", wte.detach().narrow(0, 0, 2));
    register_module("lm_head", std::make_shared<Head>(wte));
  }
  at::Tensor wte, view;
};

std::vector<std::string> Names(const UniqueParameters& params) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : params.unique) names.push_back(name);
  return names;
}

TEST(UniqueNamedParametersTest, EachTensorOnceUnderItsFirstNameAsPython) {
  Tied model;
  const UniqueParameters params = UniqueNamedParameters(model);
  // LibTorch lists three names; Python lists wte and view (a view is another tensor).
  EXPECT_EQ(model.named_parameters().size(), 3u);
  EXPECT_THAT(Names(params), ElementsAre("wte", "view"));
  EXPECT_THAT(params.repeats, ElementsAre(Pair("lm_head.weight", "wte")));
  EXPECT_TRUE(params.unique[0].second.is_same(model.wte));
}

}  // namespace
}  // namespace keel::base
