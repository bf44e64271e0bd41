#include "optim/fused_adamw.h"

#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/torch_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optim/optimizer_kind.h"
#include "testing/status_matchers.h"
#include "torch/cuda.h"

namespace keel::optim {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::OptimizerParamGroup;

// Two param groups of non-square tensors (with their own learning rates), a parameter that never
// gets a gradient, and gradients drawn afresh for every step from a fixed seed.
struct Problem {
  std::vector<at::Tensor> params;
  at::Tensor frozen;

  explicit Problem(const at::Device& device) {
    at::manual_seed(7);
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{5, 3}, {7}, {2, 9}}) {
      params.push_back(at::randn(shape).to(device).requires_grad_(true));
    }
    frozen = at::randn({4}).to(device).requires_grad_(true);
  }

  std::vector<OptimizerParamGroup> Groups() const {
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{params[0], params[1]});
    groups.emplace_back(std::vector<at::Tensor>{params[2], frozen},
                        std::make_unique<AdamWOptions>(AdamWOptions(2e-2).weight_decay(0.1)));
    return groups;
  }

  void SetGrads(int64_t step) const {
    at::manual_seed(100 + step);
    for (const at::Tensor& p : params) {
      at::Tensor owner = p;
      owner.mutable_grad() = at::randn(p.sizes()).to(p.device());
    }
  }
};

AdamWOptions Defaults(bool amsgrad) {
  return AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.01).amsgrad(amsgrad);
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(actual.sizes(), expected.sizes());
  // The fused kernel evaluates AdamW's formulas in another order: float32 rounding apart.
  EXPECT_TRUE(at::allclose(actual.cpu(), expected.cpu(), /*rtol=*/1e-5, /*atol=*/1e-6))
      << "max difference " << (actual.cpu() - expected.cpu()).abs().max().item<double>();
}

void ExpectSameTrajectory(const Problem& fused, const Problem& reference, FusedAdamW& fused_adamw,
                          torch::optim::AdamW& adamw) {
  for (size_t i = 0; i < fused.params.size(); ++i) {
    ExpectClose(fused.params[i], reference.params[i], absl::StrCat("parameter ", i));
    const auto& a = static_cast<const AdamWParamState&>(
        *fused_adamw.state().at(base::OptimizerStateKeyOf(fused.params[i])));
    const auto& b = static_cast<const AdamWParamState&>(
        *adamw.state().at(base::OptimizerStateKeyOf(reference.params[i])));
    EXPECT_EQ(a.step(), b.step());
    ExpectClose(a.exp_avg(), b.exp_avg(), absl::StrCat("exp_avg ", i));
    ExpectClose(a.exp_avg_sq(), b.exp_avg_sq(), absl::StrCat("exp_avg_sq ", i));
    if (b.max_exp_avg_sq().defined()) {
      ExpectClose(a.max_exp_avg_sq(), b.max_exp_avg_sq(), absl::StrCat("max_exp_avg_sq ", i));
    }
  }
  EXPECT_TRUE(at::equal(fused.frozen, reference.frozen));
  EXPECT_EQ(fused_adamw.state().count(base::OptimizerStateKeyOf(fused.frozen)), 0);
}

// Steps `first` to `last` of both optimizers on the same gradients, comparing after each.
void StepAlike(const Problem& fused, const Problem& reference, FusedAdamW& fused_adamw,
               torch::optim::AdamW& adamw, int64_t first, int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    fused.SetGrads(step);
    reference.SetGrads(step);
    fused_adamw.step();
    adamw.step();
    ExpectSameTrajectory(fused, reference, fused_adamw, adamw);
  }
}

// The fused step against torch::optim::AdamW's per-parameter step on `device`.
void CompareWithAdamW(const at::Device& device, bool amsgrad) {
  Problem fused(device), reference(device);
  KEEL_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FusedAdamW> fused_adamw,
                            FusedAdamW::Create(fused.Groups(), Defaults(amsgrad)));
  torch::optim::AdamW adamw(reference.Groups(), Defaults(amsgrad));
  StepAlike(fused, reference, *fused_adamw, adamw, 1, 6);
}

TEST(FusedAdamWTest, StepsAsAdamWOnTheCpu) {
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(absl::StrCat("amsgrad=", amsgrad));
    CompareWithAdamW(at::kCPU, amsgrad);
  }
}

TEST(FusedAdamWTest, StepsAsAdamWOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(absl::StrCat("amsgrad=", amsgrad));
    CompareWithAdamW(at::Device(at::kCUDA, 0), amsgrad);
  }
}

TEST(FusedAdamWTest, IsAnAdamWToTheOptimizerTable) {
  Problem problem(at::kCPU);
  KEEL_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FusedAdamW> adamw,
                            FusedAdamW::Create(problem.params, Defaults(false)));
  KEEL_ASSERT_OK_AND_ASSIGN(OptimizerKind kind, KindOf(*adamw));
  EXPECT_EQ(kind, OptimizerKind::kAdamW);
}

// A state put in from outside (a checkpoint's, here another optimizer's after 3 steps) carries
// its step count into the bias corrections of the next fused step, and a cleared state starts
// over at step 1.
TEST(FusedAdamWTest, ContinuesFromALoadedOrClearedState) {
  Problem fused(at::kCPU), reference(at::kCPU);
  KEEL_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FusedAdamW> fused_adamw,
                            FusedAdamW::Create(fused.Groups(), Defaults(false)));
  torch::optim::AdamW adamw(reference.Groups(), Defaults(false));
  fused.SetGrads(1);
  fused_adamw->step();  // its device step counts are now 1
  for (int64_t step = 1; step <= 3; ++step) {
    reference.SetGrads(step);
    adamw.step();
  }
  for (size_t i = 0; i < fused.params.size(); ++i) {
    at::NoGradGuard no_grad;
    fused.params[i].copy_(reference.params[i]);
    const auto& loaded = static_cast<const AdamWParamState&>(
        *adamw.state().at(base::OptimizerStateKeyOf(reference.params[i])));
    auto state = std::make_unique<AdamWParamState>();
    state->step(loaded.step());
    state->exp_avg(loaded.exp_avg().clone());
    state->exp_avg_sq(loaded.exp_avg_sq().clone());
    fused_adamw->state()[base::OptimizerStateKeyOf(fused.params[i])] = std::move(state);
  }
  StepAlike(fused, reference, *fused_adamw, adamw, 4, 5);

  fused_adamw->state().clear();
  adamw.state().clear();
  SCOPED_TRACE("after clearing");
  StepAlike(fused, reference, *fused_adamw, adamw, 6, 7);
}

TEST(FusedAdamWTest, RefusesTensorsTheKernelCannotStep) {
  const at::Tensor transposed = at::randn({3, 4}).t().requires_grad_(true);
  EXPECT_THAT(FusedAdamW::Create({at::randn({2}), transposed}).status(),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("param group 0, parameter 1 (CPUFloatType of shape [4, 3])")));
  EXPECT_THAT(FusedAdamW::Create({at::arange(3)}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("contiguous floating-point")));
}

}  // namespace
}  // namespace keel::optim
