// The norm check on real Gloo ranks (threads): with right layouts it equals ClipGradNorm's norm
// and finds nothing; a sharded gradient passed without its layout (each rank's own norm, the
// bug of NeMo AutoModel #3816) and a replicated one declared sharded are found and named.
#include "gradients/norm_check.h"

#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gradients/clip_grad_norm.h"
#include "gtest/gtest.h"
#include "parallel/layout.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"

namespace keel::gradients {
namespace {

using ::keel::parallel::Placement;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The whole gradients, drawn once: "rows" [8, 6] and "bias" [6].
const std::map<std::string, at::Tensor>& Whole() {
  static const auto* const grads = [] {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/5);
    return new std::map<std::string, at::Tensor>{{"rows", at::randn({8, 6}, generator, at::kFloat)},
                                                 {"bias", at::randn({6}, generator, at::kFloat)}};
  }();
  return *grads;
}

NamedParameter WithGrad(const std::string& name, const at::Tensor& grad, const at::Device& device) {
  at::Tensor param = at::zeros_like(grad).to(device).requires_grad_(true);
  param.mutable_grad() = grad.clone().to(device);
  return {name, param};
}

// Rank r's parameters on its device: its half of "rows", with the layout `declare` gives, and
// the bias whole.
std::vector<NamedParameter> Local(Rank& r, bool declare_rows, bool rows_whole) {
  const at::Tensor rows = Whole().at("rows");
  std::vector<NamedParameter> params = {
      WithGrad("rows", rows_whole ? rows : rows.chunk(2, 0)[r.rank], r.device),
      WithGrad("bias", Whole().at("bias"), r.device)};
  if (declare_rows) {
    params[0].layout =
        *parallel::EvenlySharded({8, 6}, {{"tp", r.group.get(), Placement::Shard(0)}});
  }
  return params;
}

TEST(CheckGradNormTest, RightLayoutsAgreeWithClipGradNorm) {
  std::vector<double> norms(2);
  std::vector<NormCheck> checks(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    std::vector<NamedParameter> params = Local(r, /*declare_rows=*/true, /*rows_whole=*/false);
    KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(1e9, params));
    norms[r.rank] = norm.item<double>();
    KEEL_ASSIGN_OR_RETURN(checks[r.rank], CheckGradNorm(params, r.group.get()));
    return absl::OkStatus();
  }));
  // sqrt(|rows|^2 + |bias|^2): each element once.
  const double expected =
      std::sqrt(Whole().at("rows").to(at::kDouble).square().sum().item<double>() +
                Whole().at("bias").to(at::kDouble).square().sum().item<double>());
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(checks[rank].problems, IsEmpty());
    EXPECT_NEAR(checks[rank].norm, expected, 1e-12 * expected);
    EXPECT_TRUE(checks[rank].Agrees(norms[rank]));
  }
}

// Gradients on a device, sharded over a device group (the NCCL-like group of a fake GPU's tensors):
// the check reads them to the host and exchanges its descriptions over the Gloo twin, as the
// trainer runs it, and agrees with ClipGradNorm's norm over the device group.
TEST(CheckGradNormTest, DeviceGradientsAreCheckedOverTheHostGroup) {
  std::vector<double> norms(2);
  std::vector<NormCheck> checks(2);
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [&](Rank& r) -> absl::Status {
    std::vector<NamedParameter> params = Local(r, /*declare_rows=*/true, /*rows_whole=*/false);
    KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(1e9, params));
    norms[r.rank] = norm.item<double>();
    KEEL_ASSIGN_OR_RETURN(checks[r.rank], CheckGradNorm(params, r.host_group.get()));
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(checks[rank].problems, IsEmpty());
    EXPECT_TRUE(checks[rank].Agrees(norms[rank]));
  }
}

TEST(CheckGradNormTest, AShardedGradientWithoutItsLayoutIsNamed) {
  std::vector<double> norms(2);
  std::vector<NormCheck> checks(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    std::vector<NamedParameter> params = Local(r, /*declare_rows=*/false, /*rows_whole=*/false);
    KEEL_ASSIGN_OR_RETURN(at::Tensor norm, ClipGradNorm(1e9, params));
    norms[r.rank] = norm.item<double>();  // this rank's half only: each rank its own "norm"
    KEEL_ASSIGN_OR_RETURN(checks[r.rank], CheckGradNorm(params, r.group.get()));
    return absl::OkStatus();
  }));
  EXPECT_NE(norms[0], norms[1]);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(checks[rank].Agrees(norms[rank]));
    EXPECT_THAT(checks[rank].problems,
                ElementsAre(HasSubstr("'rows': ranks 0 and 1 hold its block at [0, 0] with "
                                      "different values")));
  }
}

TEST(CheckGradNormTest, AReplicatedGradientDeclaredShardedIsNamed) {
  std::vector<NormCheck> checks(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(
        checks[r.rank],
        CheckGradNorm(Local(r, /*declare_rows=*/true, /*rows_whole=*/true), r.group.get()));
    return absl::OkStatus();
  }));
  EXPECT_THAT(checks[0].problems,
              ElementsAre(HasSubstr("'rows': rank 1's block of shape [8, 6] at [4, 0] does not "
                                    "fit in [8, 6]")));
}

TEST(CheckGradNormTest, APartialSumLeftIsAnError) {
  NamedParameter p = WithGrad("g", at::ones({2}), at::kCPU);
  p.layout = parallel::TensorLayout{{2}, {0}, {{"tp", nullptr, Placement::Partial()}}};
  EXPECT_THAT(CheckGradNorm({p}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the gradient of 'g' is still a partial sum over \"tp\"")));
}

}  // namespace
}  // namespace keel::gradients
