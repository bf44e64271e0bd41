// Recompute and RunLayers against the same computation kept whole: outputs, the inputs' and the
// parameters' gradients bit-identical, dropout's masks drawn alike and the generator left where
// it would be; a frozen input (LoRA's embedding) still gives the parameters their gradients;
// a parameter's hook runs once; "uniform" and "block" recompute the layers Megatron's do; the
// options are checked as Megatron-Core checks them.
#include "parallel/recompute.h"

#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/torch.h"

namespace keel::parallel {
namespace {

using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// Five layers x <- x + W2 dropout(gelu(W1 x)), each counting its runs.
struct Stack {
  Stack() {
    torch::manual_seed(3);
    for (int i = 0; i < 5; ++i) {
      layers.push_back({torch::nn::Linear(8, 16), torch::nn::Linear(16, 8)});
    }
  }
  at::Tensor Layer(int64_t i, const at::Tensor& x) {
    ++runs[i];
    const at::Tensor h = at::dropout(at::gelu(layers[i].first->forward(x)), 0.25, true);
    return x + layers[i].second->forward(h);
  }
  std::vector<at::Tensor> Parameters(int64_t i) {
    std::vector<at::Tensor> out = layers[i].first->parameters();
    for (const at::Tensor& p : layers[i].second->parameters()) out.push_back(p);
    return out;
  }
  std::vector<at::Tensor> All() {
    std::vector<at::Tensor> out;
    for (int64_t i = 0; i < 5; ++i) {
      for (const at::Tensor& p : Parameters(i)) out.push_back(p);
    }
    return out;
  }
  std::vector<std::pair<torch::nn::Linear, torch::nn::Linear>> layers;
  std::vector<int> runs = std::vector<int>(5, 0);
};

struct Outcome {
  at::Tensor output, input_grad, next_draw;
  std::vector<at::Tensor> grads;
  std::vector<int> runs;
};

// The stack over a fixed input (needing a gradient or not) under `options`, backward of a
// weighted sum, then one more draw from the default generator.
Outcome RunStack(const RecomputeOptions& options, bool input_needs_grad) {
  Stack stack;
  torch::manual_seed(11);
  const at::Tensor input = at::randn({4, 6, 8}).requires_grad_(input_needs_grad);
  const at::Tensor output = RunLayers(
      5, options, /*training=*/true,
      [&stack](int64_t i, const at::Tensor& x) { return stack.Layer(i, x); },
      [&stack](int64_t i) { return stack.Parameters(i); }, input);
  (output * at::linspace(-1, 1, output.numel()).view(output.sizes())).sum().backward();
  Outcome outcome{output.detach(), input.grad(), at::rand({3}), {}, stack.runs};
  for (const at::Tensor& p : stack.All()) outcome.grads.push_back(p.grad());
  return outcome;
}

RecomputeOptions Full(RecomputeMethod method, int64_t layers) {
  RecomputeOptions options;
  options.recompute_granularity = RecomputeGranularity::kFull;
  options.recompute_method = method;
  options.recompute_num_layers = layers;
  return options;
}

void ExpectSame(const Outcome& expected, const Outcome& actual) {
  EXPECT_TRUE(at::equal(expected.output, actual.output));
  if (expected.input_grad.defined()) {
    ASSERT_TRUE(actual.input_grad.defined());
    EXPECT_TRUE(at::equal(expected.input_grad, actual.input_grad));
  } else {
    EXPECT_FALSE(actual.input_grad.defined());
  }
  ASSERT_EQ(expected.grads.size(), actual.grads.size());
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    ASSERT_TRUE(actual.grads[i].defined()) << "parameter " << i;
    EXPECT_TRUE(at::equal(expected.grads[i], actual.grads[i])) << "parameter " << i;
  }
  // Recomputation draws dropout's masks again from the forward's states, then puts the
  // generator back: the run's later draws are unchanged.
  EXPECT_TRUE(at::equal(expected.next_draw, actual.next_draw));
}

TEST(RecomputeTest, UniformChunksAreBitIdentical) {
  const Outcome kept = RunStack({}, true);
  EXPECT_EQ(kept.runs, std::vector<int>({1, 1, 1, 1, 1}));
  const Outcome recomputed = RunStack(Full(RecomputeMethod::kUniform, 2), true);
  ExpectSame(kept, recomputed);
  EXPECT_EQ(recomputed.runs, std::vector<int>({2, 2, 2, 2, 2}));  // chunks {0,1} {2,3} {4}
}

TEST(RecomputeTest, BlockRecomputesTheFirstLayersOnly) {
  const Outcome recomputed = RunStack(Full(RecomputeMethod::kBlock, 2), true);
  ExpectSame(RunStack({}, true), recomputed);
  EXPECT_EQ(recomputed.runs, std::vector<int>({2, 2, 1, 1, 1}));
}

// The input needs no gradient (a frozen embedding's output under LoRA): the parameters still
// get theirs, where re-entrant checkpointing gives none (transformers#26221).
TEST(RecomputeTest, AFrozenInputStillGivesTheParametersTheirGradients) {
  ExpectSame(RunStack({}, false), RunStack(Full(RecomputeMethod::kUniform, 5), false));
}

TEST(RecomputeTest, OutsideTrainingOrGradModeNothingIsRecomputed) {
  Stack stack;
  const at::Tensor input = at::randn({2, 8}).requires_grad_(true);
  auto layer = [&stack](int64_t i, const at::Tensor& x) { return stack.Layer(i, x); };
  auto parameters = [&stack](int64_t i) { return stack.Parameters(i); };
  RunLayers(5, Full(RecomputeMethod::kUniform, 1), /*training=*/false, layer, parameters, input)
      .sum()
      .backward();
  EXPECT_EQ(stack.runs, std::vector<int>({1, 1, 1, 1, 1}));
  at::NoGradGuard no_grad;
  RunLayers(5, Full(RecomputeMethod::kUniform, 1), /*training=*/true, layer, parameters, input);
  EXPECT_EQ(stack.runs, std::vector<int>({2, 2, 2, 2, 2}));
}

// A parameter's hook (the data-parallel buckets' way of seeing its gradient) runs once per
// backward pass, and its .grad is accumulated once.
TEST(RecomputeTest, AParametersHookRunsOnce) {
  torch::manual_seed(5);
  torch::nn::Linear linear(4, 4);
  int calls = 0;
  linear->weight.register_hook([&calls](const at::Tensor&) { ++calls; });
  const at::Tensor x = at::randn({3, 4});
  Recompute([&linear](const std::vector<at::Tensor>& in) { return linear->forward(in[0]); }, {x},
            linear->parameters())
      .sum()
      .backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::allclose(linear->weight.grad(), at::ones({3, 4}).t().mm(x)));
}

// Several inputs, one not needing a gradient: each gets its own.
TEST(RecomputeTest, EachInputGetsItsGradient) {
  const at::Tensor a = at::randn({3, 4}).requires_grad_(true);
  const at::Tensor b = at::randn({4, 5}).requires_grad_(true);
  const at::Tensor c = at::randn({3, 5});
  auto f = [](const std::vector<at::Tensor>& in) { return at::tanh(in[0].mm(in[1]) + in[2]); };
  f({a, b, c}).pow(2).sum().backward();
  const at::Tensor ga = a.grad().clone(), gb = b.grad().clone();
  a.mutable_grad().reset();
  b.mutable_grad().reset();
  Recompute(f, {a, b, c}, {}).pow(2).sum().backward();
  EXPECT_TRUE(at::equal(a.grad(), ga));
  EXPECT_TRUE(at::equal(b.grad(), gb));
}

TEST(RecomputeOptionsTest, MegatronsChecksNameTheFields) {
  EXPECT_THAT(CheckRecomputeOptions({}, 4), ::keel::testing::IsOk());
  EXPECT_THAT(CheckRecomputeOptions(Full(RecomputeMethod::kBlock, 4), 4), ::keel::testing::IsOk());
  RecomputeOptions no_method = Full(RecomputeMethod::kUniform, 1);
  no_method.recompute_method.reset();
  EXPECT_THAT(CheckRecomputeOptions(no_method, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.recompute_granularity \"full\" needs "
                                 "model.recompute_method: \"uniform\" or \"block\"")));
  EXPECT_THAT(CheckRecomputeOptions(Full(RecomputeMethod::kUniform, 5), 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.recompute_num_layers (5) must be between 1 and the "
                                 "layers of a pipeline stage (4)")));
  RecomputeOptions no_count = Full(RecomputeMethod::kUniform, 1);
  no_count.recompute_num_layers.reset();
  EXPECT_THAT(CheckRecomputeOptions(no_count, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.recompute_num_layers (unset) must be between 1")));
  RecomputeOptions selective;
  selective.recompute_granularity = RecomputeGranularity::kSelective;
  EXPECT_THAT(CheckRecomputeOptions(selective, 4), ::keel::testing::IsOk());
  selective.recompute_num_layers = 2;
  EXPECT_THAT(CheckRecomputeOptions(selective, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be unset with model.recompute_granularity \"selective\"")));
  selective.recompute_num_layers.reset();
  selective.recompute_modules = {"mlp", "moe_act"};
  EXPECT_THAT(CheckRecomputeOptions(selective, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.recompute_modules: \"moe_act\" is not a module Keel "
                                 "recomputes; allowed: core_attn, mlp, layernorm")));
}

// "selective" recomputes the listed modules, core_attn by default; "full" none of them.
TEST(RecomputeTest, SelectiveRecomputesItsModules) {
  RecomputeOptions selective;
  selective.recompute_granularity = RecomputeGranularity::kSelective;
  EXPECT_TRUE(RecomputesModule(selective, kCoreAttn));
  EXPECT_FALSE(RecomputesModule(selective, kMlp));
  selective.recompute_modules = {kMlp, kLayernorm};
  EXPECT_FALSE(RecomputesModule(selective, kCoreAttn));
  EXPECT_TRUE(RecomputesModule(selective, kMlp));
  EXPECT_TRUE(RecomputesModule(selective, kLayernorm));
  EXPECT_FALSE(RecomputesModule(Full(RecomputeMethod::kUniform, 1), kCoreAttn));
  EXPECT_FALSE(RecomputesModule(RecomputeOptions(), kCoreAttn));
}

}  // namespace
}  // namespace keel::parallel
