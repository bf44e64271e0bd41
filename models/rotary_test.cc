// ApplyRotary against Hugging Face's apply_rotary_pos_emb written out (x * cos + rotate_half(x) *
// sin, rotate_half(x) = cat(-x2, x1)) over HF's tables: the same bits forward and backward, in
// float32 and bf16, on q laid out as the attention hands it over (transposed heads).
#include "models/rotary.h"

#include "ATen/ATen.h"
#include "gtest/gtest.h"
#include "models/hf_reference.h"

namespace keel::models {
namespace {

constexpr int64_t kHeadDim = 16, kSeq = 11;

HfRotaryTables Hf(at::ScalarType dtype) {
  return HfRotary(InverseFrequencies(kHeadDim, RopeOptions{}), kSeq, dtype);
}

TEST(MakeRotaryTablesTest, AreHfsCosineAndSineWithRotateHalfsSignInTheFirstHalf) {
  const auto [cos, sin] = Hf(at::kFloat);
  const RotaryTables tables =
      MakeRotaryTables(InverseFrequencies(kHeadDim, RopeOptions{}), kSeq, at::kFloat);
  EXPECT_TRUE(at::equal(tables.cos, cos));
  const int64_t half = kHeadDim / 2;
  EXPECT_TRUE(at::equal(tables.signed_sin.narrow(-1, 0, half), -sin.narrow(-1, 0, half)));
  EXPECT_TRUE(at::equal(tables.signed_sin.narrow(-1, half, half), sin.narrow(-1, half, half)));
}

TEST(ApplyRotaryTest, IsHfsRotationBitForBitForwardAndBackward) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/7);
    // [batch, seq, heads, head_dim] viewed as [batch, heads, seq, head_dim], as q and k arrive.
    const at::Tensor projected = (at::randn({2, kSeq, 3, kHeadDim}, generator) * 4).to(dtype);
    const at::Tensor upstream = at::randn({2, 3, kSeq, kHeadDim}, generator).to(dtype);
    const at::Tensor x = projected.clone().requires_grad_();
    const at::Tensor hf_x = projected.clone().requires_grad_();
    const at::Tensor out =
        ApplyRotary(x.transpose(1, 2),
                    MakeRotaryTables(InverseFrequencies(kHeadDim, RopeOptions{}), kSeq, dtype));
    const at::Tensor hf = HfApplyRotary(hf_x.transpose(1, 2), Hf(dtype));
    EXPECT_TRUE(at::equal(out, hf)) << dtype;
    out.backward(upstream);
    hf.backward(upstream);
    EXPECT_TRUE(at::equal(x.grad(), hf_x.grad())) << dtype;
  }
}

// Packed rows: each token rotates by its position in its own sequence.
TEST(ApplyRotaryTest, AtPositionsRotatesEachTokenByItsOwnPosition) {
  const RotaryTables tables =
      MakeRotaryTables(InverseFrequencies(kHeadDim, RopeOptions{}), kSeq, at::kFloat);
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 2, 3, 4}, at::kLong).view({1, 8});
  const at::Tensor x = at::randn({1, 2, 8, kHeadDim});
  const at::Tensor packed = ApplyRotary(x, AtPositions(tables, positions));
  auto first_rows = [&](int64_t n) {
    return RotaryTables{tables.cos.narrow(0, 0, n), tables.signed_sin.narrow(0, 0, n)};
  };
  const at::Tensor first = ApplyRotary(x.narrow(2, 0, 3), first_rows(3));
  const at::Tensor second = ApplyRotary(x.narrow(2, 3, 5), first_rows(5));
  EXPECT_TRUE(at::equal(packed, at::cat({first, second}, 2)));
}

}  // namespace
}  // namespace keel::models
