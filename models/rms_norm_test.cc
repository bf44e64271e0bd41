// RmsNorm against Hugging Face's LlamaRMSNorm written out op by op (float32 x / sqrt(mean(x^2) +
// eps), cast back, times the weight): the same bits forward and backward on the CPU, in float32
// and in bf16; on a GPU, LibTorch's fused kernel within a bf16 rounding of it.
#include "models/rms_norm.h"

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "gtest/gtest.h"
#include "models/hf_reference.h"

namespace keel::models {
namespace {

constexpr double kEps = 1e-5;
constexpr int64_t kSize = 64;

// x [3, 5, 64] of scale 3 (a mean square far from 1), a weight away from one, and the gradient
// from above, from a fixed generator.
struct Inputs {
  at::Tensor x, weight, upstream;
};

Inputs MakeInputs(at::ScalarType dtype, const at::Device& device) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
  auto draw = [&](at::IntArrayRef sizes, double scale, double shift) {
    return (at::randn(sizes, generator, at::kFloat) * scale + shift).to(dtype).to(device);
  };
  return {draw({3, 5, kSize}, 3, 0), draw({kSize}, 0.2, 1), draw({3, 5, kSize}, 1, 0)};
}

struct Result {
  at::Tensor out, x_grad, weight_grad;
};

Result Hf(const Inputs& in) {
  const at::Tensor x = in.x.clone().requires_grad_();
  const at::Tensor weight = in.weight.clone().requires_grad_();
  const at::Tensor out = HfRmsNorm(x, weight, kEps);
  out.backward(in.upstream);
  return {out.detach(), x.grad(), weight.grad()};
}

Result Keel(const Inputs& in) {
  RmsNorm norm(kSize, kEps);
  norm->to(in.x.device(), in.x.scalar_type());
  at::Tensor weight = norm->named_parameters()["weight"];
  {
    at::NoGradGuard no_grad;
    weight.copy_(in.weight);
  }
  const at::Tensor x = in.x.clone().requires_grad_();
  const at::Tensor out = norm->forward(x);
  out.backward(in.upstream);
  return {out.detach(), x.grad(), weight.grad()};
}

TEST(RmsNormTest, IsHfsLlamaRmsNormBitForBitOnTheCpu) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = MakeInputs(dtype, at::kCPU);
    const Result keel = Keel(in), hf = Hf(in);
    EXPECT_EQ(keel.out.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(keel.out, hf.out)) << dtype;
    EXPECT_TRUE(at::equal(keel.x_grad, hf.x_grad)) << dtype;
    EXPECT_TRUE(at::equal(keel.weight_grad, hf.weight_grad)) << dtype;
  }
}

// The fused kernel sums the squares in its own order: the normalised values may differ from
// HF's in their last bf16 bit, no more.
TEST(RmsNormTest, OnAGpuTheFusedKernelIsHfsWithinABf16Rounding) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU on this machine: the fused kernel is not run";
  const Inputs in = MakeInputs(at::kBFloat16, at::kCUDA);
  const Result keel = Keel(in), hf = Hf(in);
  auto expect_close = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
    EXPECT_TRUE(at::allclose(got.to(at::kFloat), want.to(at::kFloat), /*rtol=*/1.0 / 64,
                             /*atol=*/1e-2))
        << what << ": max difference " << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max();
  };
  expect_close(keel.out, hf.out, "output");
  expect_close(keel.x_grad, hf.x_grad, "gradient of x");
  expect_close(keel.weight_grad, hf.weight_grad, "gradient of the weight");
}

}  // namespace
}  // namespace keel::models
