// CausalAttention and SlidingWindowAttention against the explicit masked softmax.
#include "base/attention.h"

#include <vector>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "base/attention_reference.h"
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

// Within a window of 5, position t depends on keys and values t-4..t only: changing position
// 10 changes outputs 10..14 and no other; a window as long as the sequence is causal attention.
TEST(SlidingWindowAttentionTest, EachPositionSeesTheWindowBeforeIt) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  const at::Tensor out = SlidingWindowAttention(qkv[0], qkv[1], qkv[2], 5);
  const at::Tensor k = qkv[1].clone(), v = qkv[2].clone();
  k.select(2, 10).mul_(-3.0);
  v.select(2, 10).add_(1.0);
  const at::Tensor changed = SlidingWindowAttention(qkv[0], k, v, 5);
  const at::Tensor moved = (changed - out).abs().amax({0, 1, 3});  // per position
  for (int64_t t = 0; t < 37; ++t) {
    EXPECT_EQ(moved[t].item<float>() > 0, t >= 10 && t < 15) << "position " << t;
  }
  // Position 4 sees 0..4 whatever the window beyond 5; position 20 sees 16..20 in a window of 5.
  EXPECT_TRUE(at::allclose(out.narrow(2, 0, 5),
                           CausalAttention(qkv[0], qkv[1], qkv[2]).narrow(2, 0, 5), 1e-5, 1e-6));
  const at::Tensor window20 =
      CausalAttention(qkv[0].narrow(2, 16, 5), qkv[1].narrow(2, 16, 5), qkv[2].narrow(2, 16, 5));
  EXPECT_TRUE(at::allclose(out.select(2, 20), window20.select(2, 4), 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(SlidingWindowAttention(qkv[0], qkv[1], qkv[2], 37),
                        CausalAttention(qkv[0], qkv[1], qkv[2])));
}

}  // namespace
}  // namespace keel::base
