#include "gradients/parameters.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"

namespace keel::gradients {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Names(const std::vector<NamedParameter>& params) {
  std::vector<std::string> names;
  for (const NamedParameter& p : params) names.push_back(p.name);
  return names;
}

// An embedding, a frozen scale and a head tied to the embedding.
struct Tied : torch::nn::Module {
  Tied() {
    embed = register_parameter("embed", at::zeros({4, 2}));
    register_parameter("scale", at::ones({2}), /*requires_grad=*/false);
    auto head = std::make_shared<torch::nn::Module>();
    head->register_parameter("weight", embed);
    register_module("head", head);
  }
  at::Tensor embed;
};

TEST(TrainableParametersTest, EachTrainableTensorOnceUnderItsFirstName) {
  Tied model;
  Tied other;
  EXPECT_THAT(Names(TrainableParameters({&model})), ElementsAre("embed"));
  // A part's tensors and another's: each part's, in order.
  EXPECT_THAT(Names(TrainableParameters({&model, &other})), ElementsAre("embed", "embed"));
  EXPECT_THAT(Names(TrainableParameters({&model, &model})), ElementsAre("embed"));
}

TEST(TrainableParametersTest, LayoutsComeByName) {
  Tied model;
  const parallel::TensorLayout rows = parallel::BlockLayout({8, 2}, {4, 0});
  const std::vector<NamedParameter> params =
      TrainableParameters({&model}, {{"embed", rows}, {"scale", parallel::BlockLayout({4}, {2})}});
  ASSERT_EQ(params.size(), 1u);
  ASSERT_TRUE(params[0].layout.has_value());
  EXPECT_EQ(params[0].layout->global_shape, rows.global_shape);
  EXPECT_EQ(params[0].layout->offsets, rows.offsets);
  EXPECT_FALSE(TrainableParameters({&model}, {})[0].layout.has_value());
}

TEST(HasLayoutDimTest, NamesAMeshDimensionOfTheLayout) {
  NamedParameter p{"experts", at::zeros({1, 3})};
  EXPECT_FALSE(HasLayoutDim(p, "ep"));  // no layout
  p.layout = parallel::BlockLayout({2, 3}, {0, 0});
  p.layout->dims.push_back({"ep", nullptr, parallel::Placement::Shard(0)});
  EXPECT_TRUE(HasLayoutDim(p, "ep"));
  EXPECT_FALSE(HasLayoutDim(p, "tp"));
  EXPECT_FALSE(HasLayoutDim(p, ""));
}

}  // namespace
}  // namespace keel::gradients
