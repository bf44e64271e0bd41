#include "gradients/clip_grad_norm.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "torch/nn/modules/embedding.h"
#include "torch/nn/modules/linear.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

NamedParameter WithGrad(const char* name, std::vector<double> grad,
                        at::ScalarType dtype = at::kFloat) {
  at::Tensor param = at::zeros({static_cast<int64_t>(grad.size())}, dtype).requires_grad_(true);
  param.mutable_grad() = at::tensor(grad, at::kDouble).to(dtype);
  return {name, param};
}

std::vector<double> Grad(const NamedParameter& p) {
  const at::Tensor g = p.param.grad().to(at::kDouble).contiguous();
  return std::vector<double>(g.data_ptr<double>(), g.data_ptr<double>() + g.numel());
}

TEST(ClipGradNormTest, TwoNormOfThreeFourIsFiveAndClipsByMaxOverNorm) {
  std::vector<NamedParameter> params = {WithGrad("w", {3.0, -4.0})};
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(1.0, params));
  EXPECT_EQ(norm.scalar_type(), at::kDouble);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_DOUBLE_EQ(norm.item<double>(), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(Grad(params[0])[0], 3.0 * coef, 1e-6);
  EXPECT_NEAR(Grad(params[0])[1], -4.0 * coef, 1e-6);
}

TEST(ClipGradNormTest, OneAndInfinityNormsOverSeveralParameters) {
  std::vector<NamedParameter> params = {WithGrad("a", {1.0, -2.0}),
                                        WithGrad("b", {-3.0}, at::kDouble)};
  ClipGradNormOptions options;
  options.norm_type = 1.0;
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor l1, ClipGradNorm(100.0, params, options));
  // NeMo divides float32 gradients by the max (3) in float32 before the float64 sum: 1/3 and
  // 2/3 round there, so the L1 norm is 6 to float32 precision only.
  EXPECT_NEAR(l1.item<double>(), 6.0, 6.0 * 1e-7);
  options.norm_type = std::numeric_limits<double>::infinity();
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor linf, ClipGradNorm(100.0, params, options));
  EXPECT_DOUBLE_EQ(linf.item<double>(), 3.0);
  EXPECT_EQ(Grad(params[1])[0], -3.0);  // max_norm above the norm: coefficient clamped to 1
}

// NeMo's |g| / scale of a 0-d float32 gradient and the 0-d float64 scale promotes to float64
// (two 0-d tensors promote as one category); of a 1-d one it stays float32. With g = 0.1f,
// h = [0.3f] (scale 0.3f): total = 0.3f * sqrt((0.1f / 0.3f)^2 in float64 + 1). The float32
// quotient would move the total by about 1e-8 relative, far outside the tolerance, which
// allows only for sqrt's last bit.
TEST(ClipGradNormTest, AZeroDimensionalGradientIsScaledInFloat64) {
  at::Tensor g = at::zeros({}, at::kFloat).requires_grad_(true);
  g.mutable_grad() = at::full({}, 0.1f, at::kFloat);
  std::vector<NamedParameter> params = {{"g", g}, WithGrad("h", {0.3})};
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(100.0, params));
  const double scale = static_cast<double>(0.3f);
  const double term = static_cast<double>(0.1f) / scale;
  const double expected = scale * std::sqrt(term * term + 1.0);
  EXPECT_NEAR(norm.item<double>(), expected, expected * 1e-15);
  const float term_in_float32 = 0.1f / 0.3f;
  EXPECT_GT(
      std::abs(expected -
               scale * std::sqrt(static_cast<double>(term_in_float32 * term_in_float32) + 1.0)),
      expected * 1e-12);
}

TEST(ClipGradNormTest, AbsentMaxNormSkipsEverythingAndReturnsZero) {
  std::vector<NamedParameter> params = {WithGrad("w", {30.0, 40.0})};
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(std::nullopt, params));
  EXPECT_EQ(norm.item<double>(), 0.0);
  EXPECT_EQ(Grad(params[0])[1], 40.0);
}

TEST(ClipGradNormTest, ParametersWithoutGradientsAndEmptyGradientsAreFine) {
  at::Tensor no_grad = at::zeros({3}).requires_grad_(true);
  std::vector<NamedParameter> params = {
      {"none", no_grad}, WithGrad("empty", {}), WithGrad("w", {0.0, 2.0})};
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(1.0, params));
  EXPECT_DOUBLE_EQ(norm.item<double>(), 2.0);
  EXPECT_FALSE(no_grad.grad().defined());
  std::vector<NamedParameter> nothing = {{"none", no_grad}};
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor zero, ClipGradNorm(1.0, nothing));
  EXPECT_EQ(zero.item<double>(), 0.0);
}

TEST(ClipGradNormTest, NonFiniteNormIsAppliedOrRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<NamedParameter> params = {WithGrad("w", {1.0, nan})};
  ClipGradNormOptions options;
  options.error_if_nonfinite = true;
  EXPECT_THAT(
      ClipGradNorm(1.0, params, options),
      StatusIs(
          StatusCode::kFailedPrecondition,
          HasSubstr("The total norm of order 2 for gradients from `parameters` is non-finite")));
  EXPECT_EQ(Grad(params[0])[0], 1.0);  // refused before any scaling
  options.error_if_nonfinite = false;
  KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(1.0, params, options));
  EXPECT_TRUE(std::isnan(norm.item<double>()));
  EXPECT_TRUE(std::isnan(Grad(params[0])[0]));
}

TEST(ClipGradNormTest, ZeroOrNanNormTypeIsAnError) {
  std::vector<NamedParameter> params = {WithGrad("w", {1.0})};
  ClipGradNormOptions options;
  options.norm_type = 0.0;
  EXPECT_THAT(ClipGradNorm(1.0, params, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("norm_type (0) must be non-zero")));
  options.norm_type = std::nan("");
  EXPECT_THAT(ClipGradNorm(1.0, params, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("NaN")));
}

TEST(ClipGradNormTest, ForeachAndPerTensorScalingGiveIdenticalValues) {
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(7);
    const at::Tensor values = at::randn({1000}, at::kDouble) * 3;
    std::vector<double> raw(values.data_ptr<double>(), values.data_ptr<double>() + 1000);
    std::vector<NamedParameter> batched = {WithGrad("w", raw, dtype)};
    std::vector<NamedParameter> single = {WithGrad("w", raw, dtype)};
    ClipGradNormOptions options;
    options.foreach = true;
    KEEL_ASSERT_OK(ClipGradNorm(0.5, batched, options).status());
    options.foreach = false;
    KEEL_ASSERT_OK(ClipGradNorm(0.5, single, options).status());
    EXPECT_TRUE(at::equal(batched[0].param.grad(), single[0].param.grad()));
  }
}

TEST(ClipGradNormTest, FusedTwoNormAgreesWithTheExactPathToRounding) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(11);
    std::vector<NamedParameter> exact;
    std::vector<NamedParameter> fused;
    for (int64_t n : {0, 1, 7, 100003}) {
      const at::Tensor values = (at::randn({n}, at::kDouble) * 2).to(dtype).to(at::kDouble);
      std::vector<double> raw(values.data_ptr<double>(), values.data_ptr<double>() + n);
      exact.push_back(WithGrad("w", raw, dtype));
      fused.push_back(WithGrad("w", raw, dtype));
    }
    ClipGradNormOptions options;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor exact_norm, ClipGradNorm(1.0, exact, options));
    options.algorithm = NormAlgorithm::kFused;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor fused_norm, ClipGradNorm(1.0, fused, options));
    // NeMo's path rounds |g| / max in the gradient's dtype (2^-8 relative for bfloat16); the
    // fused path accumulates each tensor in float (LibTorch's norm kernel).
    const double tolerance = dtype == at::kBFloat16 ? 1e-2 : dtype == at::kHalf ? 2e-3 : 1e-6;
    EXPECT_NEAR(fused_norm.item<double>(), exact_norm.item<double>(),
                tolerance * exact_norm.item<double>());
  }
}

// NeMo's op sequence for one group of float32 gradients, written out with ATen ops.
double NemoTwoNorm(const std::vector<at::Tensor>& grads) {
  at::Tensor max = at::zeros({}, at::kDouble);
  for (const at::Tensor& g : grads) max = at::maximum(max, g.abs().max().to(at::kDouble));
  const at::Tensor scale =
      at::where(at::isfinite(max).logical_and(max.ne(0)), max, at::ones_like(max));
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (const at::Tensor& g : grads) sum = sum + g.abs().div(scale).square().sum(at::kDouble);
  return (max * sum.pow(0.5)).item<double>();
}

TEST(ClipGradNormTest, ExactPathEqualsNemosOpSequenceBitForBit) {
  at::manual_seed(5);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denormal = std::numeric_limits<float>::denorm_min();
  // Magnitudes over 60 binades, tails that are not a multiple of any vector width, a
  // non-contiguous gradient, signed zeros, denormals, and non-finite values.
  std::vector<std::vector<at::Tensor>> cases = {
      {at::randn({4099}) * at::exp(at::randn({4099}) * 10), at::randn({3, 5}),
       at::randn({64, 70}).t()},
      {at::tensor({-0.0f, 0.0f, -0.0f})},
      {at::tensor({denormal, -denormal * 3, 1e-30f})},
      {at::randn({1000}) * 1e30, at::randn({17})},
      {at::tensor({1.0f, -inf, 2.0f}), at::randn({100})},
      {at::tensor({1.0f, nan}), at::randn({100})},
      {at::randn({(1 << 17) + 3})},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(absl::StrCat("case ", c));
    std::vector<NamedParameter> params;
    for (const at::Tensor& g : cases[c]) {
      at::Tensor param = at::zeros(g.sizes()).requires_grad_(true);
      param.mutable_grad() = g.clone();  // keeps a transposed gradient's strides
      ASSERT_EQ(param.grad().is_contiguous(), g.is_contiguous());
      params.push_back({"w", param});
    }
    const double expected = NemoTwoNorm(cases[c]);
    ClipGradNormOptions options;
    options.foreach = false;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(1e40, params, options));
    const double actual = norm.item<double>();
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(actual)) << actual;
    } else {
      EXPECT_EQ(actual, expected);
      EXPECT_EQ(std::signbit(actual), std::signbit(expected));
    }
  }
}

TEST(ClipGradNormTest, FusedBFloat16NormAccumulatesInFloatWhateverTheThreadCount) {
  at::manual_seed(9);
  // bfloat16 squares summed in bfloat16 would stop growing near 256 x the first square.
  const at::Tensor big = (at::randn({300001}) * 3).to(at::kBFloat16);
  const double reference = big.to(at::kDouble).norm().item<double>();
  const int threads = at::get_num_threads();
  std::vector<double> norms;
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    at::Tensor param = at::zeros({300001}, at::kBFloat16).requires_grad_(true);
    param.mutable_grad() = big.clone();
    std::vector<NamedParameter> params = {{"w", param}};
    ClipGradNormOptions options;
    options.algorithm = NormAlgorithm::kFused;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(1e9, params, options));
    norms.push_back(norm.item<double>());
  }
  at::set_num_threads(threads);
  EXPECT_NEAR(norms[0], reference, 1e-6 * reference);
  EXPECT_EQ(norms[0], norms[1]);
}

TEST(TrainableParametersTest, NamesEveryParameterThatRequiresGrad) {
  torch::nn::Linear linear(3, 2);
  linear->bias.set_requires_grad(false);
  const std::vector<NamedParameter> params = TrainableParameters({linear.get()});
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].name, "weight");
}

TEST(TrainableParametersTest, NamesATiedWeightOnceUnderItsFirstName) {
  struct Head : torch::nn::Module {
    explicit Head(const at::Tensor& tied) { register_parameter("weight", tied); }
  };
  struct Tied : torch::nn::Module {
    Tied() {
      embedding = register_module("embedding", torch::nn::Embedding(4, 3));
      register_module("head", std::make_shared<Head>(embedding->weight));
      register_parameter("bias", at::zeros({4}));
    }
    torch::nn::Embedding embedding{nullptr};
  } model;
  ASSERT_EQ(model.named_parameters().size(), 3u);  // LibTorch lists the tie twice
  const std::vector<NamedParameter> params = TrainableParameters({&model});
  std::vector<std::string> names;
  for (const NamedParameter& p : params) names.push_back(p.name);
  EXPECT_THAT(names, ::testing::ElementsAre("bias", "embedding.weight"));
}

TEST(ScaleGradsAndClipGradNormTest, PipelineScalingDividesEveryGradByTokensPerDpRank) {
  std::vector<NamedParameter> params = {WithGrad("w", {8.0}), WithGrad("b", {-4.0})};
  GradScalingOptions scaling;
  scaling.pp_enabled = true;
  scaling.num_label_tokens = 8;
  scaling.dp_group_size = 2;  // divide by 8 / 2 = 4
  KEEL_ASSERT_OK(ScaleGradsAndClipGradNorm(std::nullopt, params, scaling).status());
  EXPECT_EQ(Grad(params[0])[0], 2.0);
  EXPECT_EQ(Grad(params[1])[0], -1.0);
  scaling.pp_enabled = false;  // no PP: no scaling
  KEEL_ASSERT_OK(ScaleGradsAndClipGradNorm(std::nullopt, params, scaling).status());
  EXPECT_EQ(Grad(params[0])[0], 2.0);
}

TEST(ScaleGradsAndClipGradNormTest, ExpertScalingSelectsByNamePatternOrLayoutAxis) {
  std::vector<NamedParameter> params = {
      WithGrad("model.layers.0.mlp.experts.gate_up_linear.weight0", {12.0}),
      WithGrad("layers.1.moe.w", {12.0}), WithGrad("layers.1.attn.w", {12.0})};
  params[1].layout = parallel::TensorLayout{{1}, {0}, {{"ep", nullptr, {}}}};
  GradScalingOptions scaling;
  scaling.dp_group_size = 8;
  scaling.ep_shard_size = 2;
  scaling.expert_tp_replication_factor = 3;  // divide experts by (8 / 2) * 3 = 12
  scaling.ep_axis_name = "ep";
  KEEL_ASSERT_OK(ScaleGradsAndClipGradNorm(std::nullopt, params, scaling).status());
  EXPECT_EQ(Grad(params[0])[0], 1.0);   // TE grouped-experts name
  EXPECT_EQ(Grad(params[1])[0], 1.0);   // layout on the "ep" axis
  EXPECT_EQ(Grad(params[2])[0], 12.0);  // not an expert
}

// NeMo's pattern (^|\.)mlp\.experts\.(gate_up_linear|down_linear)\.(weight|bias)\d+, searched
// anywhere in the name.
TEST(ScaleGradsAndClipGradNormTest, TeExpertPatternMatchesAsNeMosRegexSearch) {
  const std::vector<std::pair<std::string, bool>> names = {
      {"mlp.experts.gate_up_linear.weight0", true},
      {"model.layers.3.mlp.experts.down_linear.bias12", true},
      {"a.mlp.experts.down_linear.weight7.extra", true},
      {"xmlp.experts.down_linear.bias3", false},      // not at a name boundary
      {"mlp.experts.down_linear.bias", false},        // no expert index
      {"mlp.experts.gate_up_linear.weightX", false},  // not a digit
      {"mlp.experts.up_linear.weight0", false},
      {"xmlp.experts.a.mlp.experts.down_linear.weight1", true},  // a later occurrence
  };
  for (const auto& [name, expert] : names) {
    SCOPED_TRACE(name);
    std::vector<NamedParameter> params = {WithGrad(name.c_str(), {4.0})};
    GradScalingOptions scaling;
    scaling.dp_group_size = 4;
    scaling.ep_shard_size = 1;  // divide experts by 4 / 1
    KEEL_ASSERT_OK(ScaleGradsAndClipGradNorm(std::nullopt, params, scaling).status());
    EXPECT_EQ(Grad(params[0])[0], expert ? 1.0 : 4.0);
  }
}

// Zero counts and sizes: a pipeline divisor of 0 (no tokens, or dp 0) skips the PP scaling, as
// NeMo's guards do; an expert scaling by dp 0 / ep would divide by 0 (infinite gradients in NeMo)
// and is an error, as are negative values.
TEST(ScaleGradsAndClipGradNormTest, ZeroCountsSkipScalingAndDivisionsByZeroAreErrors) {
  std::vector<NamedParameter> params = {
      WithGrad("model.layers.0.mlp.experts.gate_up_linear.weight0", {6.0})};
  for (const auto& [tokens, dp] : {std::pair<int64_t, int64_t>{8, 0}, {0, 4}}) {
    SCOPED_TRACE(absl::StrCat("tokens ", tokens, ", dp ", dp));
    GradScalingOptions scaling;
    scaling.pp_enabled = true;
    scaling.num_label_tokens = tokens;
    scaling.dp_group_size = dp;
    params[0].param.mutable_grad() = at::full({1}, 6.0);
    KEEL_ASSERT_OK(ScaleGradsAndClipGradNorm(std::nullopt, params, scaling).status());
    EXPECT_EQ(Grad(params[0])[0], 6.0);
  }
  GradScalingOptions expert;
  expert.dp_group_size = 0;
  expert.ep_shard_size = 2;
  EXPECT_THAT(ScaleGradsAndClipGradNorm(1.0, params, expert),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("dp_group_size (0) must be > 0 for expert scaling")));
  EXPECT_EQ(Grad(params[0])[0], 6.0);  // refused before anything is divided
  GradScalingOptions negative;
  negative.ep_shard_size = -1;
  EXPECT_THAT(ScaleGradsAndClipGradNorm(1.0, params, negative),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ep_shard_size (-1) must be >= 0")));
}

TEST(ScaleGradsAndClipGradNormTest, ReplicationFactorBelowOneIsAnError) {
  std::vector<NamedParameter> params = {WithGrad("w", {1.0})};
  GradScalingOptions scaling;
  scaling.expert_tp_replication_factor = 0;
  EXPECT_THAT(ScaleGradsAndClipGradNorm(1.0, params, scaling),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("expert_tp_replication_factor (0) must be >= 1")));
}

}  // namespace
}  // namespace keel::gradients
