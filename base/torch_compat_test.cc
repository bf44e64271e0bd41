// CausalAttention against the explicit masked softmax it replaces on LibTorch 2.x.
#include "base/torch_compat.h"

#include <vector>

#include "ATen/ATen.h"
#include "gtest/gtest.h"

namespace keel::base {
namespace {

// q, k, v [2 batches, 3 heads, 37 positions, 16] from a fixed CPU generator, needing gradients.
std::vector<at::Tensor> Inputs(at::ScalarType dtype) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
  std::vector<at::Tensor> qkv;
  for (int i = 0; i < 3; ++i) {
    qkv.push_back(at::randn({2, 3, 37, 16}, generator, at::kFloat).to(dtype).requires_grad_(true));
  }
  return qkv;
}

TEST(CausalAttentionTest, IsTheMaskedSoftmaxItsOutputAndGradients) {
  const std::vector<at::Tensor> fused = Inputs(at::kFloat);
  const std::vector<at::Tensor> explicit_ = Inputs(at::kFloat);
  const at::Tensor out = CausalAttention(fused[0], fused[1], fused[2]);
  const at::Tensor expected = CausalAttentionExplicit(explicit_[0], explicit_[1], explicit_[2]);
  ASSERT_EQ(out.sizes(), expected.sizes());
  // Up to the order of the sums (the fused kernel goes over the keys in blocks).
  EXPECT_TRUE(at::allclose(out, expected, /*rtol=*/1e-5, /*atol=*/1e-6));
  const at::Tensor weights = at::linspace(-1, 1, out.numel()).view(out.sizes());
  (out * weights).sum().backward();
  (expected * weights).sum().backward();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(fused[i].grad(), explicit_[i].grad(), /*rtol=*/1e-4, /*atol=*/1e-6))
        << "gradient of input " << i << ": max difference "
        << (fused[i].grad() - explicit_[i].grad()).abs().max().item<float>();
  }
}

// Position t sees positions 0..t only: changing keys and values from position 20 on leaves the
// outputs before it exactly as they were, and changes position 20's.
TEST(CausalAttentionTest, EachPositionSeesOnlyItselfAndEarlierOnes) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  const at::Tensor out = CausalAttention(qkv[0], qkv[1], qkv[2]);
  const at::Tensor k = qkv[1].clone(), v = qkv[2].clone();
  k.narrow(2, 20, 17).mul_(-3.0);
  v.narrow(2, 20, 17).add_(1.0);
  const at::Tensor changed = CausalAttention(qkv[0], k, v);
  EXPECT_TRUE(at::equal(changed.narrow(2, 0, 20), out.narrow(2, 0, 20)));
  EXPECT_FALSE(at::allclose(changed.select(2, 20), out.select(2, 20)));
}

// The first position attends to itself alone: its output is its own value.
TEST(CausalAttentionTest, TheFirstPositionIsItsOwnValue) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  for (const at::Tensor& out :
       {CausalAttention(qkv[0], qkv[1], qkv[2]), CausalAttentionExplicit(qkv[0], qkv[1], qkv[2])}) {
    EXPECT_TRUE(at::allclose(out.select(2, 0), qkv[2].select(2, 0), /*rtol=*/1e-6, /*atol=*/1e-7));
  }
}

}  // namespace
}  // namespace keel::base
