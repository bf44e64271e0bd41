#include "peft/lora_adapter.h"

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "peft/module_matcher.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/torch.h"

namespace keel::peft {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// An MLP of the two kinds of layer: up [8 -> 12] column-parallel, down [12 -> 8] row-parallel;
// with sequence_parallel its input and output are this rank's share of the sequence.
class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(c10d::ProcessGroup* tp, bool sequence_parallel = false)
      : up_(register_module(
            "up_proj", parallel::ColumnParallelLinear(8, 12, tp, /*bias=*/true,
                                                      /*gather_output=*/false, sequence_parallel))),
        down_(register_module("down_proj", parallel::RowParallelLinear(12, 8, tp, /*bias=*/true,
                                                                       /*input_is_parallel=*/true,
                                                                       sequence_parallel))) {}
  at::Tensor forward(const at::Tensor& x) { return down_->forward(at::gelu(up_->forward(x))); }

 private:
  parallel::ColumnParallelLinear up_;
  parallel::RowParallelLinear down_;
};
TORCH_MODULE(Mlp);

Mlp OneRank() {
  c10d::ProcessGroup* const no_group = nullptr;
  return Mlp(no_group);
}

// A model with random weights, its adapters attached (A drawn from seed 3) and, with
// `random_b`, B random too (as after some training).
Mlp Adapted(const LoraOptions& options, bool random_b) {
  Mlp model = OneRank();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
  at::NoGradGuard no_grad;
  for (at::Tensor& p : model->parameters()) p.normal_(0.0, 0.3, generator);
  torch::manual_seed(3);
  const absl::StatusOr<std::vector<LinearModule>> modules = SelectLinearModules(*model, options);
  EXPECT_TRUE(modules.ok()) << modules.status();
  EXPECT_TRUE(AttachLoraAdapters(*model, *modules, options).ok());
  for (const auto& item : model->named_parameters()) {
    if (random_b && item.key().find("lora_B") != std::string::npos) {
      item.value().normal_(0.0, 0.3, generator);
    }
  }
  return model;
}

const at::Tensor& Input() {
  static const at::Tensor* const x =
      new at::Tensor(at::linspace(-1, 1, 2 * 4 * 8, at::kFloat).view({2, 4, 8}));
  return *x;
}

// B starts at zero: the adapted model computes the base model's output, to the bit; only the
// adapters train.
TEST(LoraAdapterTest, TheFirstOutputIsTheBaseModelsAndOnlyAdaptersTrain) {
  Mlp base = Adapted(LoraOptions(), /*random_b=*/false);
  at::Tensor expected;
  {
    Mlp plain = OneRank();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
    at::NoGradGuard no_grad;
    for (at::Tensor& p : plain->parameters()) p.normal_(0.0, 0.3, generator);
    expected = plain->forward(Input());
  }
  const at::Tensor output = base->forward(Input());
  EXPECT_TRUE(at::equal(output, expected));
  output.sum().backward();
  std::vector<std::string> trainable;
  for (const auto& item : base->named_parameters()) {
    if (item.value().requires_grad()) {
      trainable.push_back(item.key());
      EXPECT_TRUE(item.value().grad().defined()) << item.key();
    } else {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
    }
  }
  EXPECT_THAT(trainable,
              ::testing::ElementsAre("up_proj.adapter.lora_A", "up_proj.adapter.lora_B",
                                     "down_proj.adapter.lora_A", "down_proj.adapter.lora_B"));
}

// y = base(x) + B(A(x) * alpha / dim), AutoModel's order, on both kinds of layer; dropout off
// in eval mode either way.
TEST(LoraAdapterTest, ComputesBaseplusScaledBA) {
  LoraOptions options;
  options.dim = 4;
  options.alpha = 6;
  options.dropout = 0.5;
  Mlp model = Adapted(options, /*random_b=*/true);
  model->eval();
  auto p = model->named_parameters();
  const auto linear = [&](const std::string& layer, const at::Tensor& x) {
    const at::Tensor base = at::linear(x, p[layer + ".weight"], p[layer + ".bias"]);
    return base + at::linear(at::linear(x, p[layer + ".adapter.lora_A"]) * 1.5,
                             p[layer + ".adapter.lora_B"]);
  };
  const at::Tensor expected = linear("down_proj", at::gelu(linear("up_proj", Input())));
  EXPECT_TRUE(at::allclose(model->forward(Input()), expected, 1e-6, 1e-6));
}

// Dropout in training: "post" zeroes elements of the adapter's output and doubles the others
// (p = 0.5); "pre" drops A's input, so the adapter's output changes but the base's does not.
TEST(LoraAdapterTest, DropoutActsWhereItIsAsked) {
  LoraOptions options;
  options.dropout = 0.5;
  const at::Tensor x = Input().select(0, 0);  // [3, 8], through the column-parallel layer alone
  for (const DropoutPosition position : {DropoutPosition::kPost, DropoutPosition::kPre}) {
    SCOPED_TRACE(AbslUnparseFlag(position));
    options.dropout_position = position;
    Mlp model = Adapted(options, /*random_b=*/true);
    torch::nn::Module& up = *model->named_modules()["up_proj"];
    auto* adapter = up.named_children()["adapter"]->as<LoraAdapterImpl>();
    ASSERT_NE(adapter, nullptr);
    model->eval();
    const at::Tensor kept = adapter->forward(x);
    model->train();
    torch::manual_seed(9);
    const at::Tensor dropped = adapter->forward(x);
    EXPECT_FALSE(at::allclose(dropped, kept));
    if (position == DropoutPosition::kPost) {
      const at::Tensor zero = dropped.eq(0);
      EXPECT_GT(zero.sum().item<int64_t>(), 0);
      EXPECT_TRUE(at::allclose(dropped.masked_select(zero.logical_not()),
                               2 * kept.masked_select(zero.logical_not())));
    }
  }
}

// A's initialisation: xavier_normal_ (std sqrt(2 / (in + dim))) or kaiming_uniform_ with
// a = sqrt(5) (bound 1 / sqrt(in)), from the default generator.
TEST(LoraAdapterTest, AIsDrawnAsAskedAndBIsZero) {
  LoraOptions options;
  options.dim = 64;
  Mlp xavier = Adapted(options, /*random_b=*/false);
  const at::Tensor a = xavier->named_parameters()["up_proj.adapter.lora_A"];
  EXPECT_NEAR(a.std().item<double>(), std::sqrt(2.0 / (8 + 64)), 0.03);
  EXPECT_TRUE(at::equal(xavier->named_parameters()["up_proj.adapter.lora_B"], at::zeros({12, 64})));
  options.lora_A_init = LoraAInit::kUniform;
  Mlp uniform = Adapted(options, /*random_b=*/false);
  const at::Tensor u = uniform->named_parameters()["down_proj.adapter.lora_A"];
  EXPECT_LE(u.abs().max().item<double>(), 1 / std::sqrt(12.0));
  EXPECT_GT(u.abs().max().item<double>(), 0.9 / std::sqrt(12.0));
}

// Two tensor-parallel ranks compute the one-rank model's output, and each adapter's gradient is
// its block of the one-rank gradient (A whole and B split on the column-parallel layer, A split
// and B whole on the row-parallel one): the layouts the adapters report. With
// `sequence_parallel` each rank computes its half of the sequence, and the gradients of the
// column layer's A and the row layer's B are then its part, summed over the ranks.
void ExpectTwoRanksComputeTheOneRankModel(bool sequence_parallel) {
  LoraOptions options;
  options.dim = 4;
  Mlp whole = Adapted(options, /*random_b=*/true);
  const at::Tensor whole_out = whole->forward(Input());
  (whole_out * whole_out).sum().backward();
  std::vector<std::vector<std::string>> differing(2);
  std::mutex generator;  // ranks are threads sharing the default generator
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(r.group.get(), sequence_parallel);
    {
      std::lock_guard<std::mutex> lock(generator);
      KEEL_ASSIGN_OR_RETURN(std::vector<LinearModule> modules,
                            SelectLinearModules(*model, options));
      KEEL_RETURN_IF_ERROR(AttachLoraAdapters(*model, modules, options));
    }
    KEEL_RETURN_IF_ERROR(parallel::CopyFromWholeModel(*model, *whole));
    const auto half = [&](const at::Tensor& x) {
      return sequence_parallel ? x.narrow(1, 2 * r.rank, 2) : x;
    };
    const at::Tensor out = model->forward(half(Input()));
    (out * out).sum().backward();
    if (!at::allclose(out, half(whole_out), 1e-5, 1e-6)) differing[r.rank].push_back("output");
    const std::vector<std::string> summed = parallel::SequenceParallelParameters(*model);
    const std::vector<std::string> expected_summed =
        sequence_parallel ? std::vector<std::string>{"down_proj.adapter.lora_B", "down_proj.bias",
                                                     "up_proj.adapter.lora_A"}
                          : std::vector<std::string>{};
    EXPECT_EQ(summed, expected_summed);
    auto parameters = model->named_parameters();
    for (const std::string& name : summed) {
      at::Tensor grad = parameters[name].grad();
      if (grad.defined()) parallel::AllReduceInPlace(grad, r.group.get());
    }
    const std::map<std::string, parallel::TensorLayout> layouts =
        parallel::ParameterLayouts(*model);
    EXPECT_EQ(layouts.count("up_proj.adapter.lora_B"), 1u);
    EXPECT_EQ(layouts.count("down_proj.adapter.lora_A"), 1u);
    EXPECT_EQ(layouts.count("up_proj.adapter.lora_A"), 0u);
    const auto whole_params = whole->named_parameters();
    for (const auto& item : parameters) {
      if (!item.value().requires_grad()) continue;
      at::Tensor expected = whole_params[item.key()].grad();
      if (auto it = layouts.find(item.key()); it != layouts.end()) {
        expected = parallel::BlockOf(expected, it->second, item.value().sizes());
      }
      if (!at::allclose(item.value().grad(), expected, 1e-5, 1e-6)) {
        differing[r.rank].push_back(item.key());
      }
    }
    return absl::OkStatus();
  }));
  EXPECT_THAT(differing, ::testing::ElementsAre(::testing::IsEmpty(), ::testing::IsEmpty()));
}

TEST(LoraAdapterTest, TwoRanksComputeTheOneRankModel) {
  ExpectTwoRanksComputeTheOneRankModel(/*sequence_parallel=*/false);
}

TEST(LoraAdapterTest, SequenceParallelRanksComputeTheOneRankModel) {
  ExpectTwoRanksComputeTheOneRankModel(/*sequence_parallel=*/true);
}

// Each rank draws A whole, as one rank does, and keeps its block.
TEST(LoraAdapterTest, EveryLayoutStartsFromTheOneRankAdapters) {
  Mlp whole = Adapted(LoraOptions(), /*random_b=*/false);
  std::vector<std::vector<std::string>> differing(2);
  std::mutex generator;
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(r.group.get());
    std::lock_guard<std::mutex> lock(generator);
    torch::manual_seed(3);
    KEEL_ASSIGN_OR_RETURN(std::vector<LinearModule> modules,
                          SelectLinearModules(*model, LoraOptions()));
    KEEL_RETURN_IF_ERROR(AttachLoraAdapters(*model, modules, LoraOptions()));
    const std::map<std::string, parallel::TensorLayout> layouts =
        parallel::ParameterLayouts(*model);
    const auto whole_params = whole->named_parameters();
    for (const auto& item : model->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      at::Tensor expected = whole_params[item.key()];
      if (auto it = layouts.find(item.key()); it != layouts.end()) {
        expected = parallel::BlockOf(expected, it->second, item.value().sizes());
      }
      if (!at::equal(item.value(), expected)) differing[r.rank].push_back(item.key());
    }
    return absl::OkStatus();
  }));
  EXPECT_THAT(differing, ::testing::ElementsAre(::testing::IsEmpty(), ::testing::IsEmpty()));
}

// A pipeline stage holding some of the layers draws every A in the one-rank model's order and
// keeps its own.
TEST(LoraAdapterTest, AStageKeepsItsLayersAdaptersOfTheOneRankModel) {
  Mlp whole = Adapted(LoraOptions(), /*random_b=*/false);
  torch::nn::Module stage;
  c10d::ProcessGroup* const no_group = nullptr;
  stage.register_module("down_proj", parallel::RowParallelLinear(12, 8, no_group));
  torch::manual_seed(3);
  KEEL_ASSERT_OK(
      AttachLoraAdapters(stage, {{"up_proj", 8, 12}, {"down_proj", 12, 8}}, LoraOptions()));
  const auto params = stage.named_parameters();
  ASSERT_TRUE(params.contains("down_proj.adapter.lora_A"));
  EXPECT_TRUE(at::equal(params["down_proj.adapter.lora_A"],
                        whole->named_parameters()["down_proj.adapter.lora_A"]));
}

// peft.lora_dtype float32 on a bf16 base: float32 adapters (A as drawn, not rounded), the
// layer's output still bf16.
TEST(LoraAdapterTest, LoraDtypeKeepsTheAdaptersInTheirOwnDtype) {
  Mlp whole = Adapted(LoraOptions(), /*random_b=*/false);
  Mlp model = OneRank();
  model->to(at::kBFloat16);
  LoraOptions options;
  options.lora_dtype = LoraDtype::kFloat32;
  torch::manual_seed(3);
  KEEL_ASSERT_OK(AttachLoraAdapters(*model, *SelectLinearModules(*model, options), options));
  const auto params = model->named_parameters();
  EXPECT_EQ(params["up_proj.adapter.lora_B"].scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(params["up_proj.adapter.lora_A"],
                        whole->named_parameters()["up_proj.adapter.lora_A"]));
  EXPECT_EQ(model->forward(Input().to(at::kBFloat16)).scalar_type(), at::kBFloat16);

  Mlp base_dtype = OneRank();
  base_dtype->to(at::kBFloat16);
  KEEL_ASSERT_OK(AttachLoraAdapters(*base_dtype, {{"up_proj", 8, 12}}, LoraOptions()));
  EXPECT_EQ(base_dtype->named_parameters()["up_proj.adapter.lora_A"].scalar_type(), at::kBFloat16);
}

TEST(LoraAdapterTest, WhatCannotBeAdaptedIsNamed) {
  torch::nn::Module outer;
  outer.register_module("mlp", OneRank());
  EXPECT_THAT(AttachLoraAdapters(outer, {{"mlp", 8, 12}}, LoraOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mlp is not a linear layer of the model")));
  KEEL_ASSERT_OK(AttachLoraAdapters(outer, {{"mlp.up_proj", 8, 12}}, LoraOptions()));
  EXPECT_THAT(AttachLoraAdapters(outer, {{"mlp.up_proj", 8, 12}}, LoraOptions()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("mlp.up_proj already has an adapter")));
}

// An r too large to allocate (2^44 rows of 8 floats: past any address space) is an error
// naming r; the allocator's exception once ended the process.
TEST(LoraAdapterTest, AdaptersTooLargeToAllocateAreNamedByR) {
  torch::nn::Module outer;
  outer.register_module("mlp", OneRank());
  LoraOptions options;
  options.dim = int64_t{1} << 44;
  EXPECT_THAT(AttachLoraAdapters(outer, {{"mlp.up_proj", 8, 12}}, options),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("attaching the LoRA adapters of r 17592186044416")));
}

}  // namespace
}  // namespace keel::peft
