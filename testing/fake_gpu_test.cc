// The fake GPU is another device than the CPU that computes what the CPU computes: views share
// its memory, in-place operations through them land, autograd gives the CPU's gradients,
// modules move to it, an optimizer steps there as on the CPU (up to the rounding of layer norm,
// which LibTorch computes by its generic decomposition off the CPU), and it does not mix with
// host tensors.
#include "testing/fake_gpu.h"

#include "ATen/ATen.h"
#include "c10/core/DeviceGuard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "torch/nn/modules/linear.h"
#include "torch/nn/modules/normalization.h"
#include "torch/optim/adamw.h"

namespace keel::testing {
namespace {

using ::testing::HasSubstr;

TEST(FakeGpuTest, TensorsLiveThereAndCopyBothWays) {
  const at::Tensor host = at::arange(6, at::kFloat).view({2, 3});
  const at::Tensor device = host.to(FakeGpu());
  EXPECT_EQ(device.device(), FakeGpu());
  EXPECT_FALSE(device.is_cpu());
  EXPECT_EQ(FakeGpu().str(), "ve:0");
  EXPECT_TRUE(at::equal(device.cpu(), host));
  EXPECT_EQ(at::empty_like(device.t().contiguous()).device(), FakeGpu());
  EXPECT_EQ(device.sum().item<float>(), 15.0f);
}

TEST(FakeGpuTest, ViewsShareMemoryAndInPlaceOperationsThroughThemLand) {
  at::Tensor flat = at::zeros({6}).to(FakeGpu());
  flat.narrow(0, 2, 3).copy_(at::ones({3}));
  flat.view({2, 3}).select(0, 0).narrow(0, 0, 2).add_(at::full({2}, 5.0).to(FakeGpu()));
  EXPECT_TRUE(at::equal(flat.cpu(), at::tensor({5.0f, 5.0f, 1.0f, 1.0f, 1.0f, 0.0f})));
}

TEST(FakeGpuTest, GradientsAreTheCpusToTheBit) {
  const at::Tensor values = at::linspace(-2, 2, 12).view({3, 4});
  const auto gradient = [&](const at::Device& device) {
    at::Tensor x = values.clone().to(device).requires_grad_(true);
    (x.chunk(2, 1)[1].contiguous() * x.narrow(1, 0, 2)).sin().sum().backward();
    return x.grad().cpu();
  };
  const at::Tensor on_cpu = gradient(at::kCPU);
  EXPECT_TRUE(at::equal(gradient(FakeGpu()), on_cpu));
}

TEST(FakeGpuTest, ModulesMoveThereAndAnOptimizerStepsThemAsOnTheCpu) {
  const auto train = [](const at::Device& device) {
    torch::manual_seed(3);
    torch::nn::Linear linear(4, 3);
    torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({3}));
    linear->to(device);
    norm->to(device);
    EXPECT_EQ(linear->weight.device(), device);
    std::vector<at::Tensor> parameters = linear->parameters();
    for (const at::Tensor& p : norm->parameters()) parameters.push_back(p);
    torch::optim::AdamW adamw(parameters, torch::optim::AdamWOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      adamw.zero_grad();
      norm->forward(linear->forward(at::linspace(0, 1, 20).view({5, 4}).to(device)))
          .mul(at::arange(3, at::kFloat).to(device))
          .sum()
          .backward();
      adamw.step();
    }
    return linear->weight.detach().cpu();
  };
  const at::Tensor on_cpu = train(at::kCPU);
  EXPECT_TRUE(at::allclose(train(FakeGpu()), on_cpu, /*rtol=*/1e-5, /*atol=*/1e-6));
}

TEST(FakeGpuTest, EachFakeGpuHasItsMemoryAndTheCurrentOneIsPerThread) {
  const at::Tensor on_three = at::ones({2}).to(FakeGpu(3));
  EXPECT_EQ(on_three.device(), FakeGpu(3));
  EXPECT_EQ((on_three * 2).device(), FakeGpu(3));
  {
    const c10::DeviceGuard guard(FakeGpu(5));
    EXPECT_EQ(at::empty({2}, at::TensorOptions().device(c10::kVE)).device(), FakeGpu(5));
  }
  EXPECT_EQ(at::empty({2}, at::TensorOptions().device(c10::kVE)).device(), FakeGpu(0));
}

TEST(FakeGpuTest, DoesNotMixWithHostTensors) {
  try {
    (void)(at::ones({2}).to(FakeGpu()) + at::ones({2}));
    ADD_FAILURE() << "a host and a fake GPU tensor were added";
  } catch (const c10::Error& error) {
    EXPECT_THAT(error.what_without_backtrace(),
                HasSubstr("Expected all tensors to be on the same device"));
  }
  // A 0-d host tensor is a scalar, which a GPU's operations take too.
  EXPECT_TRUE(
      at::equal((at::ones({2}).to(FakeGpu()) * at::scalar_tensor(3.0)).cpu(), at::full({2}, 3.0)));
}

}  // namespace
}  // namespace keel::testing
