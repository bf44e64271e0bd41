#include "gradients/dp_sync.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/embedding.h"
#include "ATen/ops/equal.h"
#include "ATen/ops/zeros.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/nn/module.h"

namespace keel::gradients {
namespace {

using ::absl::StatusCode;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kIn = 4;
constexpr int64_t kHidden = 16;
constexpr int64_t kOut = 3;

// Deterministic values without touching the global torch generator (ranks run on threads).
at::Tensor Wave(at::IntArrayRef shape, double phase, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  return at::arange(numel, at::TensorOptions().dtype(dtype))
      .mul(0.37)
      .add(phase)
      .sin()
      .mul(0.5)
      .reshape(shape);
}

// y = tanh(x w1^T + b1) w2^T + b2, with an optional parameter `extra` that forward uses only
// when `use_extra` is set.
class Mlp : public torch::nn::Module {
 public:
  explicit Mlp(double phase, at::ScalarType dtype = at::kFloat, bool with_extra = false) {
    w1_ = register_parameter("w1", Wave({kHidden, kIn}, phase, dtype));
    b1_ = register_parameter("b1", Wave({kHidden}, phase + 1, dtype));
    w2_ = register_parameter("w2", Wave({kOut, kHidden}, phase + 2, dtype));
    b2_ = register_parameter("b2", Wave({kOut}, phase + 3, dtype));
    if (with_extra) extra_ = register_parameter("extra", Wave({kOut}, phase + 4, dtype));
  }

  at::Tensor Forward(const at::Tensor& x) const {
    at::Tensor y = x.matmul(w1_.t()).add(b1_).tanh().matmul(w2_.t()).add(b2_);
    return use_extra ? y.mul(extra_) : y;
  }

  at::Device device() const { return w1_.device(); }

  bool use_extra = false;

 private:
  at::Tensor w1_, b1_, w2_, b2_, extra_;
};

// Samples [first, first + count) of the global data set: inputs and regression targets.
at::Tensor Inputs(int64_t first, int64_t count, at::ScalarType dtype) {
  return at::arange(first * kIn, (first + count) * kIn, at::TensorOptions().dtype(dtype))
      .mul(0.11)
      .add(0.3)
      .sin()
      .reshape({count, kIn});
}
at::Tensor Targets(int64_t first, int64_t count, at::ScalarType dtype) {
  return at::arange(first * kOut, (first + count) * kOut, at::TensorOptions().dtype(dtype))
      .mul(0.23)
      .cos()
      .reshape({count, kOut});
}

// Sum of squared errors over `count` samples, divided by `divisor`.
at::Tensor Loss(const Mlp& model, int64_t first, int64_t count, double divisor,
                at::ScalarType dtype) {
  return model.Forward(Inputs(first, count, dtype).to(model.device()))
      .sub(Targets(first, count, dtype).to(model.device()))
      .pow(2)
      .sum()
      .div(divisor);
}

std::vector<at::Tensor> Grads(const torch::nn::Module& model) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void ClearGrads(torch::nn::Module& model) {
  for (at::Tensor& p : model.parameters()) p.mutable_grad().reset();
}

// Plain SGD, so that the two-step test needs no optimizer.
void SgdStep(torch::nn::Module& model, double lr) {
  at::NoGradGuard no_grad;
  for (at::Tensor& p : model.parameters()) p.sub_(p.grad().mul(lr));
}

// Largest |a - b| over every element, relative to the largest |b|.
double MaxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double diff = 0;
  double scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, a[i].sub(b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

void ExpectIdentical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "tensor " << i;
}

// A data-parallel layout of the global batch: `world` ranks, `micro_batches` micro-batches of
// `batch` samples each per optimizer step. Rank r's micro-batch k of step s holds the samples
// starting at ((s * micro_batches + k) * world + r) * batch.
struct Layout {
  int world = 1;
  int micro_batches = 1;
  int64_t batch = 2;
  int64_t global() const { return world * micro_batches * batch; }
  int64_t First(int step, int k, int rank) const {
    return ((int64_t{step} * micro_batches + k) * world + rank) * batch;
  }
};

// One rank's optimizer step with NeMo's call sequence. Each micro-batch's loss is divided by
// global batch / world, so that the DP average is the global-batch mean.
absl::Status TrainStep(Mlp& model, DataParallelGradSync& sync, const Layout& l, int step, int rank,
                       at::ScalarType dtype) {
  sync.PrepareForGradAccumulation();
  for (int k = 0; k < l.micro_batches; ++k) {
    if (k == l.micro_batches - 1) sync.PrepareForFinalBackward();
    Loss(model, l.First(step, k, rank), l.batch, double(l.micro_batches * l.batch), dtype)
        .backward();
  }
  return sync.Wait();
}

// Tolerance, relative to the largest gradient, for "N ranks x K micro-batches" against "one
// rank, whole global batch". Per element both compute the same sum of B per-sample terms t_i
// (B <= 24 here), in different orders (matmul reductions over a micro-batch, K accumulations,
// the ring all-reduce) and with 1/B split into 1/(K b) and 1/N. Recursive summation errs by at
// most (B - 1) u sum|t_i| (u = unit roundoff), so |dp - ref| <= 2 (B - 1) u sum|t_i| plus a few
// u per term from the forward pass and divisions. For this data sum|t_i| <= 1.22 max|grad|
// (measured per element from float64 per-sample gradients), so the bound is < 70 u; we allow
// 100 u: 6e-6 for float32, 1.2e-14 for float64. Observed: <= 2 u and 3 u. Real bugs are far
// larger: a missing rank or a wrong divisor is off by >= 1/N >= 1/3.
double Tolerance(at::ScalarType dtype) { return dtype == at::kDouble ? 1.2e-14 : 6e-6; }

class DataParallelGradSyncTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(DataParallelGradSyncTest, AccumulationMatchesOneRankOnTheGlobalBatch) {
  const at::ScalarType dtype = GetParam();
  for (int world : {1, 2, 3}) {
    for (int micro_batches : {1, 4}) {
      for (double bucket_cap_mb : {25.0, 1e-6}) {  // 1e-6 MiB: one parameter per bucket
        SCOPED_TRACE(absl::StrCat("world=", world, " micro_batches=", micro_batches,
                                  " bucket_cap_mb=", bucket_cap_mb));
        const Layout l{world, micro_batches, /*batch=*/2};
        Mlp reference(/*phase=*/0, dtype);
        Loss(reference, 0, l.global(), double(l.global()), dtype).backward();
        const std::vector<at::Tensor> expected = Grads(reference);

        std::vector<std::vector<at::Tensor>> grads(world);
        std::vector<size_t> buckets(world);
        KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
          // Ranks start different; init_sync gives them rank 0's parameters.
          Mlp model(/*phase=*/r.rank, dtype);
          DataParallelGradSyncOptions options;
          options.bucket_cap_mb = bucket_cap_mb;
          KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group, options));
          buckets[r.rank] = sync->num_buckets();
          KEEL_RETURN_IF_ERROR(TrainStep(model, *sync, l, /*step=*/0, r.rank, dtype));
          grads[r.rank] = Grads(model);
          return absl::OkStatus();
        }));
        EXPECT_EQ(buckets[0], bucket_cap_mb < 1 ? 4u : 1u);
        for (int rank = 0; rank < world; ++rank) {
          SCOPED_TRACE(absl::StrCat("rank ", rank));
          ExpectIdentical(grads[rank], grads[0]);  // every rank divides the same sums
        }
        EXPECT_LE(MaxRelativeDifference(grads[0], expected), Tolerance(dtype));
      }
    }
  }
}

TEST_P(DataParallelGradSyncTest, TwoOptimizerStepsMatchOneRank) {
  const at::ScalarType dtype = GetParam();
  const Layout l{/*world=*/3, /*micro_batches=*/2, /*batch=*/2};
  constexpr double kLr = 0.1;
  Mlp reference(/*phase=*/0, dtype);
  for (int step = 0; step < 2; ++step) {
    ClearGrads(reference);
    Loss(reference, l.First(step, 0, 0), l.global(), double(l.global()), dtype).backward();
    SgdStep(reference, kLr);
  }
  const std::vector<at::Tensor> expected = reference.parameters();

  std::vector<std::vector<at::Tensor>> params(l.world);
  KEEL_ASSERT_OK(RunOnRanks(l.world, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0, dtype);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    for (int step = 0; step < 2; ++step) {
      if (step == 1) {  // the second step accumulates onto zeroed rather than absent grads
        for (at::Tensor& p : model.parameters()) p.mutable_grad().zero_();
      }
      KEEL_RETURN_IF_ERROR(TrainStep(model, *sync, l, step, r.rank, dtype));
      SgdStep(model, kLr);
    }
    params[r.rank] = model.parameters();
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < l.world; ++rank) ExpectIdentical(params[rank], params[0]);
  // Parameters (~0.5) move by lr * grad (lr = 0.1), so they stay within the gradient bound.
  EXPECT_LE(MaxRelativeDifference(params[0], expected), Tolerance(dtype));
}

// On a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them) the buckets, the check that the ranks agree, the initial broadcast and the
// reductions exchange no host tensor, and give the gradients of the same step on Gloo within the
// bound above (the fake GPU runs the CPU's kernels, or LibTorch's generic ones). The check that
// the ranks agree all-reduced a host tensor here before it was made to use the parameters'
// device.
TEST(DataParallelGradSyncTest, OnADeviceGroupNoHostTensorIsExchanged) {
  const Layout l{/*world=*/2, /*micro_batches=*/2, /*batch=*/2};
  const auto step = [&l](std::vector<std::vector<at::Tensor>>& grads) {
    return [&](Rank& r) -> absl::Status {
      Mlp model(/*phase=*/r.rank);
      model.to(r.device);
      DataParallelGradSyncOptions options;
      options.bucket_cap_mb = 1e-6;  // one bucket per parameter
      KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group, options));
      KEEL_RETURN_IF_ERROR(TrainStep(model, *sync, l, /*step=*/0, r.rank, at::kFloat));
      for (const at::Tensor& grad : Grads(model)) grads[r.rank].push_back(grad.cpu());
      return absl::OkStatus();
    };
  };
  std::vector<std::vector<at::Tensor>> host(l.world), device(l.world);
  KEEL_ASSERT_OK(RunOnRanks(l.world, step(host)));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(l.world, step(device)));
  for (int rank = 0; rank < l.world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_LE(MaxRelativeDifference(device[rank], host[rank]), Tolerance(at::kFloat));
  }
}

// Parameters on the host cannot be synchronised over a device group: refused at creation,
// naming the parameter, before any exchange.
TEST(DataParallelGradSyncTest, HostParametersOnADeviceGroupAreRefused) {
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0);
    EXPECT_THAT(DataParallelGradSync::Create(model, *r.group).status(),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("the gradient all-reduce of parameter 'w1': a host (cpu) "
                                   "tensor cannot go over a process group of backend \"nccl\"")));
    return absl::OkStatus();
  }));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DataParallelGradSyncTest,
                         ::testing::Values(at::kFloat, at::kDouble),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(c10::toString(info.param));
                         });

TEST(DataParallelGradSyncTest, AccumulationMicroBatchesDoNotCommunicate) {
  const Layout l{/*world=*/3, /*micro_batches=*/3, /*batch=*/2};
  // [rank][micro-batch]: the gradients of the synchronised replica and of a plain local one.
  std::vector<std::vector<std::vector<at::Tensor>>> synced(l.world), local(l.world);
  std::vector<absl::Status> early_wait(l.world);
  KEEL_ASSERT_OK(RunOnRanks(l.world, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0);
    Mlp plain(/*phase=*/0);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    sync->PrepareForGradAccumulation();
    for (int k = 0; k < l.micro_batches - 1; ++k) {
      const int64_t first = l.First(0, k, r.rank);
      Loss(model, first, l.batch, 1.0, at::kFloat).backward();
      Loss(plain, first, l.batch, 1.0, at::kFloat).backward();
      synced[r.rank].push_back(Grads(model));
      local[r.rank].push_back(Grads(plain));
    }
    early_wait[r.rank] = sync->Wait();
    sync->PrepareForFinalBackward();
    Loss(model, l.First(0, l.micro_batches - 1, r.rank), l.batch, 1.0, at::kFloat).backward();
    return sync->Wait();
  }));
  for (int rank = 0; rank < l.world; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_EQ(synced[rank].size(), 2u);
    // Bit for bit the local gradients: nothing was reduced or rewritten.
    for (int k = 0; k < 2; ++k) ExpectIdentical(synced[rank][k], local[rank][k]);
    EXPECT_THAT(early_wait[rank],
                StatusIs(StatusCode::kFailedPrecondition, HasSubstr("gradient-accumulation mode")));
    // Each rank saw different samples, so its gradients differ from rank 0's.
    if (rank > 0) {
      EXPECT_GT(MaxRelativeDifference(synced[rank][0], synced[0][0]), 1e-3);
    }
  }
}

TEST(DataParallelGradSyncTest, InitSyncCopiesRankZerosParametersUnlessDisabled) {
  for (bool init_sync : {true, false}) {
    SCOPED_TRACE(absl::StrCat("init_sync=", init_sync));
    std::vector<std::vector<at::Tensor>> params(3);
    KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
      Mlp model(/*phase=*/r.rank);
      DataParallelGradSyncOptions options;
      options.init_sync = init_sync;
      KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group, options));
      params[r.rank] = model.parameters();
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<at::Tensor> expected = Mlp(init_sync ? 0 : rank).parameters();
      ExpectIdentical(params[rank], expected);
    }
  }
}

TEST(DataParallelGradSyncTest, DestroyingRemovesTheHooks) {
  Mlp model(/*phase=*/0);
  Mlp plain(/*phase=*/0);
  KEEL_ASSERT_OK(RunOnRanks(1, [&](Rank& r) -> absl::Status {
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    return absl::OkStatus();
  }));
  Loss(model, 0, 2, 1.0, at::kFloat).backward();
  Loss(plain, 0, 2, 1.0, at::kFloat).backward();
  ExpectIdentical(Grads(model), Grads(plain));
}

TEST(DataParallelGradSyncTest, RejectsBadOptionsAndModules) {
  std::vector<absl::Status> bad_caps;
  absl::Status frozen_status, complex_status;
  KEEL_ASSERT_OK(RunOnRanks(1, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0);
    for (double cap : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      DataParallelGradSyncOptions options;
      options.bucket_cap_mb = cap;
      bad_caps.push_back(DataParallelGradSync::Create(model, *r.group, options).status());
    }
    torch::nn::Module frozen;
    frozen.register_parameter("w", at::zeros({2}), /*requires_grad=*/false);
    frozen_status = DataParallelGradSync::Create(frozen, *r.group).status();
    torch::nn::Module complex;
    complex.register_parameter("z", at::zeros({2}, at::kComplexFloat));
    complex_status = DataParallelGradSync::Create(complex, *r.group).status();
    return absl::OkStatus();
  }));
  for (const absl::Status& status : bad_caps) {
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, HasSubstr("bucket_cap_mb")));
  }
  EXPECT_THAT(frozen_status, StatusIs(StatusCode::kInvalidArgument, HasSubstr("no parameter")));
  EXPECT_THAT(complex_status,
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("'z' has dtype ComplexFloat")));
}

TEST(DataParallelGradSyncTest, RanksWithDifferentParametersAreRejected) {
  std::vector<absl::Status> statuses(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0, at::kFloat, /*with_extra=*/r.rank == 1);
    statuses[r.rank] = DataParallelGradSync::Create(model, *r.group).status();
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument, HasSubstr("modules differ")));
  }
}

TEST(DataParallelGradSyncTest, UnusedParameterIsAnErrorAndRanksStayInStep) {
  std::vector<absl::Status> first(2);
  std::vector<std::vector<at::Tensor>> grads(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0, at::kFloat, /*with_extra=*/true);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    Loss(model, r.rank * 2, 2, 1.0, at::kFloat).backward();
    first[r.rank] = sync->Wait();
    // Every bucket was still reduced, so a following step pairs its collectives correctly.
    ClearGrads(model);
    model.use_extra = true;
    Loss(model, r.rank * 2, 2, 1.0, at::kFloat).backward();
    KEEL_RETURN_IF_ERROR(sync->Wait());
    grads[r.rank] = Grads(model);
    return absl::OkStatus();
  }));
  for (const absl::Status& status : first) {
    EXPECT_THAT(status, StatusIs(StatusCode::kFailedPrecondition,
                                 HasSubstr("parameter 'extra' received no gradient")));
  }
  ExpectIdentical(grads[1], grads[0]);
}

// Rank 1's gradients are NaN: the averages are NaN on every rank, but only rank 1's own sum
// before the reduction is; the others' is the float64 sum of their local gradients.
TEST(DataParallelGradSyncTest, LocalGradientSumTellsWhichRankWentNonFinite) {
  std::vector<double> sums(3), expected(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
    const double divisor = r.rank == 1 ? std::numeric_limits<double>::quiet_NaN() : 1.0;
    Mlp alone(/*phase=*/0);  // the same gradients, never synchronised
    Loss(alone, r.rank * 2, 2, divisor, at::kFloat).backward();
    double local = 0;
    for (const at::Tensor& g : Grads(alone)) local += g.sum(at::kDouble).item<double>();
    expected[r.rank] = local;
    Mlp model(/*phase=*/0);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    Loss(model, r.rank * 2, 2, divisor, at::kFloat).backward();
    KEEL_RETURN_IF_ERROR(sync->Wait());
    EXPECT_TRUE(Grads(model)[0].isnan().all().item<bool>());
    sums[r.rank] = sync->LocalGradientSum().item<double>();
    return absl::OkStatus();
  }));
  EXPECT_TRUE(std::isnan(sums[1]));
  for (int rank : {0, 2}) {
    ASSERT_TRUE(std::isfinite(sums[rank]));
    // One bucket, summed in another order than parameter by parameter.
    EXPECT_NEAR(sums[rank], expected[rank], 1e-6 * std::abs(expected[rank]) + 1e-9);
  }
}

// Only rank 1 leaves a parameter without gradient: its peers learn of it in the same Wait
// (not at their next collective, after a timeout).
TEST(DataParallelGradSyncTest, AnErrorOnOneRankReachesItsPeersInTheSameWait) {
  std::vector<absl::Status> statuses(3);
  KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0, at::kFloat, /*with_extra=*/true);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    model.use_extra = r.rank != 1;
    Loss(model, r.rank * 2, 2, 1.0, at::kFloat).backward();
    statuses[r.rank] = sync->Wait();
    return absl::OkStatus();
  }));
  EXPECT_THAT(statuses[1], StatusIs(StatusCode::kFailedPrecondition,
                                    HasSubstr("parameter 'extra' received no gradient")));
  for (int rank : {0, 2}) {
    EXPECT_THAT(statuses[rank], StatusIs(StatusCode::kAborted,
                                         "rank 1 failed the gradient all-reduce; see its error"));
  }
}

TEST(DataParallelGradSyncTest, SecondBackwardBeforeWaitIsAnError) {
  std::vector<absl::Status> statuses(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0);
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    Loss(model, 0, 2, 1.0, at::kFloat).backward();
    Loss(model, 2, 2, 1.0, at::kFloat).backward();
    statuses[r.rank] = sync->Wait();
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(StatusCode::kFailedPrecondition,
                                 HasSubstr("parameter 'b2' received a second gradient")));
  }
}

// Main gradients (Megatron's main_grad): each backward pass adds into float32 buckets and frees
// the bf16 .grad; the errors are the plain path's; a local sync (one rank, no group) needs
// main gradients; destroying the sync removes its hooks from the gradient accumulators.
TEST(DataParallelGradSyncTest, MainGradientsKeepThePlainPathsContract) {
  DataParallelGradSyncOptions main;
  main.main_grad_dtype = at::kFloat;
  std::vector<absl::Status> twice(2), unused(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Mlp model(/*phase=*/0, at::kBFloat16, /*with_extra=*/true);
    model.use_extra = true;
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group, main));
    Loss(model, 0, 2, 1.0, at::kBFloat16).backward();
    for (const at::Tensor& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
    Loss(model, 2, 2, 1.0, at::kBFloat16).backward();
    twice[r.rank] = sync->Wait();
    model.use_extra = false;
    Loss(model, 0, 2, 1.0, at::kBFloat16).backward();
    unused[r.rank] = sync->Wait();
    EXPECT_EQ(sync->MainGrad(0).scalar_type(), at::kFloat);
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(twice[rank],
                StatusIs(StatusCode::kFailedPrecondition, HasSubstr("received a second gradient")));
    EXPECT_THAT(unused[rank], StatusIs(StatusCode::kFailedPrecondition,
                                       HasSubstr("parameter 'extra' received no gradient")));
  }
  Mlp model(/*phase=*/0, at::kBFloat16);
  EXPECT_THAT(DataParallelGradSync::CreateLocal(TrainableParameters({&model}), {}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("set main_grad_dtype")));
  {
    KEEL_ASSERT_OK_AND_ASSIGN(
        auto local, DataParallelGradSync::CreateLocal(TrainableParameters({&model}), main));
    Loss(model, 0, 2, 1.0, at::kBFloat16).backward();
    KEEL_ASSERT_OK(local->Wait());
    EXPECT_FALSE(model.parameters()[0].grad().defined());
  }
  Loss(model, 0, 2, 1.0, at::kBFloat16).backward();
  for (const at::Tensor& p : model.parameters()) EXPECT_TRUE(p.grad().defined());
}

// A rank without a micro-batch (an epoch's short last step) joins the reduction with zeros:
// the average is the other rank's gradients halved, whether it had accumulated nothing or
// one micro-batch before running out, with DDP's gradients in .grad or main gradients.
TEST(DataParallelGradSyncTest, ARankThatSkipsItsBackwardJoinsWithWhatItHas) {
  for (bool main_grads : {false, true}) {
    for (int accumulated : {0, 1}) {
      SCOPED_TRACE(absl::StrCat(main_grads ? "main gradients" : "DDP", ", ", accumulated,
                                " micro-batch(es) before running out"));
      Mlp reference(/*phase=*/0);
      Loss(reference, 0, 2, 2.0, at::kFloat).backward();                       // rank 0's, halved
      if (accumulated > 0) Loss(reference, 2, 2, 2.0, at::kFloat).backward();  // rank 1's
      const std::vector<at::Tensor> expected = Grads(reference);
      std::vector<std::vector<at::Tensor>> grads(2);
      KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
        Mlp model(/*phase=*/0);
        DataParallelGradSyncOptions options;
        if (main_grads) options.main_grad_dtype = at::kFloat;
        KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group, options));
        if (r.rank == 0) {
          Loss(model, 0, 2, 1.0, at::kFloat).backward();
        } else {
          sync->PrepareForGradAccumulation();
          if (accumulated > 0) Loss(model, 2, 2, 1.0, at::kFloat).backward();
          sync->SkipBackward();
        }
        KEEL_RETURN_IF_ERROR(sync->Wait());
        for (size_t i = 0; i < model.parameters().size(); ++i) {
          grads[r.rank].push_back(main_grads ? sync->MainGrad(i).clone()
                                             : model.parameters()[i].grad().clone());
        }
        return absl::OkStatus();
      }));
      ExpectIdentical(grads[1], grads[0]);
      EXPECT_LE(MaxRelativeDifference(grads[0], expected), Tolerance(at::kFloat));
    }
  }
}

// An embedding with sparse=true produces a sparse gradient for a dense parameter.
class SparseEmbedding : public torch::nn::Module {
 public:
  SparseEmbedding() { weight_ = register_parameter("weight", at::zeros({5, 2})); }
  at::Tensor Forward(const at::Tensor& ids) const {
    return at::embedding(weight_, ids, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false,
                         /*sparse=*/true);
  }

 private:
  at::Tensor weight_;
};

TEST(DataParallelGradSyncTest, SparseGradientIsAnError) {
  std::vector<absl::Status> statuses(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    SparseEmbedding model;
    KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
    model.Forward(at::arange(3)).sum().backward();
    statuses[r.rank] = sync->Wait();
    return absl::OkStatus();
  }));
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument,
                                 HasSubstr("'weight' has a sparse gradient")));
  }
}

TEST(DataParallelGradSyncTest, LostPeerSurfacesFromWait) {
  absl::Status waited;
  KEEL_ASSERT_OK(RunOnRanks(
      2,
      [&](Rank& r) -> absl::Status {
        Mlp model(/*phase=*/0);
        KEEL_ASSIGN_OR_RETURN(auto sync, DataParallelGradSync::Create(model, *r.group));
        if (r.rank == 1) return absl::OkStatus();       // leaves, closing its end of the group
        Loss(model, 0, 2, 1.0, at::kFloat).backward();  // the hooks must not throw
        waited = sync->Wait();
        return absl::OkStatus();
      },
      /*timeout=*/std::chrono::seconds(3)));
  EXPECT_THAT(waited, StatusIs(StatusCode::kUnavailable, HasSubstr("all-reduce of gradient")));
}

}  // namespace
}  // namespace keel::gradients
