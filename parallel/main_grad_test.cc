// parallel::MainGradOf finds the main gradient a sync offers on a weight's gradient
// accumulator; AddProductInto writes or adds grad_output^T input as autograd and the sync would.
#include "parallel/main_grad.h"

#include <memory>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "torch/csrc/autograd/function.h"
#include "torch/csrc/autograd/function_hook.h"
#include "torch/csrc/autograd/variable.h"
#include "torch/cuda.h"

namespace keel::parallel {
namespace {

// A sync's offer, as the gradient buckets make it: a post-hook that is also a MainGrad.
class Offer : public torch::autograd::FunctionPostHook, public MainGrad {
 public:
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    return outputs;
  }
  void AddWeightGradient(const at::Tensor& /*grad_output*/, const at::Tensor& /*input*/) override {}
};

class OtherHook : public torch::autograd::FunctionPostHook {
 public:
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    return outputs;
  }
};

TEST(MainGradOfTest, FindsTheOfferOnTheWeightsAccumulatorAndNothingElse) {
  const at::Tensor weight = at::zeros({3, 2}).requires_grad_(true);
  EXPECT_EQ(MainGradOf(weight), nullptr) << "no accumulator yet";
  const std::shared_ptr<torch::autograd::Node> accumulator =
      torch::autograd::impl::grad_accumulator(weight);
  accumulator->add_post_hook(std::make_unique<OtherHook>());
  EXPECT_EQ(MainGradOf(weight), nullptr) << "a hook that offers nothing";
  auto offer = std::make_unique<Offer>();
  MainGrad* offered = offer.get();
  accumulator->add_post_hook(std::move(offer));
  EXPECT_EQ(MainGradOf(weight), offered);

  EXPECT_EQ(MainGradOf(weight * 2), nullptr) << "not a leaf";
  EXPECT_EQ(MainGradOf(at::zeros({3, 2})), nullptr) << "no gradient";
  EXPECT_EQ(MainGradOf(at::Tensor()), nullptr);
}

// Small integers times 1/8: every product and sum is exact in bf16 and float32, so any order
// of the sums gives the same bits.
at::Tensor Eighths(std::vector<int64_t> shape, int64_t seed, at::ScalarType dtype) {
  at::manual_seed(seed);
  return at::randint(-8, 9, shape).div(8).to(dtype);
}

TEST(AddProductIntoTest, WritesThenAddsTheProductAsAutogradAndTheSyncWould) {
  const at::Tensor grad_output = Eighths({5, 3}, 1, at::kBFloat16);
  const at::Tensor input = Eighths({5, 4}, 2, at::kBFloat16);
  const at::Tensor product = at::mm(grad_output.t(), input).to(at::kFloat);
  at::Tensor rows = at::full({3, 4}, 7.0);
  AddProductInto(rows, grad_output, input, /*overwrite=*/true);
  EXPECT_TRUE(at::equal(rows, product));
  AddProductInto(rows, grad_output, input, /*overwrite=*/false);
  EXPECT_TRUE(at::equal(rows, product * 2));
  // A block of the weight's rows: the gradient's matching columns.
  at::Tensor block = at::zeros({2, 4});
  AddProductInto(block, grad_output.narrow(1, 1, 2), input, /*overwrite=*/true);
  EXPECT_TRUE(at::equal(block, product.narrow(0, 1, 2)));
}

TEST(AddProductIntoTest, OnAGpuBf16InputsAccumulateInFloat32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: the CUDA path is not checked here";
  const at::Device gpu(at::kCUDA, 0);
  at::manual_seed(3);
  // 4096 tokens of values near 1: their bf16 product, rounded to 8 bits of mantissa, is off by
  // far more than the float32 accumulation.
  const at::Tensor grad_output = (at::rand({4096, 64}) + 0.5).to(at::kBFloat16);
  const at::Tensor input = (at::rand({4096, 32}) + 0.5).to(at::kBFloat16);
  const at::Tensor exact = at::mm(grad_output.t().to(at::kDouble), input.to(at::kDouble));
  at::Tensor rows = at::full({64, 32}, 1.0, at::TensorOptions(gpu));
  AddProductInto(rows, grad_output.narrow(1, 0, 64).to(gpu), input.to(gpu), /*overwrite=*/true);
  const double float32_error = (rows.cpu().to(at::kDouble) - exact).abs().max().item<double>();
  const double bf16_error = (at::mm(grad_output.t(), input).to(at::kDouble) - exact)
                                .abs()
                                .max()
                                .item<double>();
  EXPECT_LT(float32_error, exact.abs().max().item<double>() * 1e-5);
  EXPECT_LT(float32_error * 100, bf16_error);
  AddProductInto(rows, grad_output.to(gpu), input.to(gpu), /*overwrite=*/false);
  EXPECT_LT((rows.cpu().to(at::kDouble) - exact * 2).abs().max().item<double>(),
            exact.abs().max().item<double>() * 2e-5);
}

}  // namespace
}  // namespace keel::parallel
