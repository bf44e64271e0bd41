#include "optim/distributed_optimizer.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/grad_mode.h"
#include "ATen/ops/allclose.h"
#include "ATen/ops/arange.h"
#include "ATen/ops/equal.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "gmock/gmock.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "gtest/gtest.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/optim/adamw.h"
#include "torch/optim/lbfgs.h"
#include "torch/optim/sgd.h"

namespace keel::optim {
namespace {

using ::absl::StatusCode;
using ::keel::gradients::ParamShard;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// A two-layer perceptron over a 17-row embedding, its values deterministic without the
// global generator (ranks run on threads).
class Net : public torch::nn::Module {
 public:
  Net() {
    auto wave = [](at::IntArrayRef shape, double phase) {
      int64_t numel = 1;
      for (int64_t size : shape) numel *= size;
      return at::arange(numel, at::kFloat).mul(0.41).add(phase).sin().mul(0.4).reshape(shape);
    };
    embed_ = register_parameter("embed", wave({17, 8}, 0));
    w1_ = register_parameter("w1", wave({12, 8}, 1));
    b1_ = register_parameter("b1", wave({12}, 2));
    w2_ = register_parameter("w2", wave({3, 12}, 3));
  }

  // Mean squared output over samples [first, first + count).
  at::Tensor Loss(int64_t first, int64_t count) const {
    const at::Tensor tokens = at::arange(first, first + count, at::kLong).remainder(17);
    return embed_.index_select(0, tokens)
        .matmul(w1_.t())
        .add(b1_)
        .tanh()
        .matmul(w2_.t())
        .sub(0.3)
        .pow(2)
        .mean();
  }

 private:
  at::Tensor embed_, w1_, b1_, w2_;
};

std::vector<at::Tensor> Tensors(const std::vector<ParamShard>& shards) {
  std::vector<at::Tensor> tensors;
  for (const ParamShard& shard : shards) tensors.push_back(shard.tensor);
  return tensors;
}

torch::optim::AdamWOptions Adam() {
  return torch::optim::AdamWOptions(0.05).betas({0.9, 0.95}).weight_decay(0.1);
}
torch::optim::SGDOptions Sgd() { return torch::optim::SGDOptions(0.1).momentum(0.9); }

template <typename Optimizer, typename Options>
ShardOptimizerFactory Factory(Options options) {
  return [options](const std::vector<ParamShard>& shards) {
    return std::make_unique<Optimizer>(Tensors(shards), options);
  };
}

// One rank's step: 2 micro-batches of 2 samples, the global mean over world x 4 samples.
template <typename Sync>
absl::Status Backward(Net& net, Sync& sync, int step, int rank, int world) {
  sync.PrepareForGradAccumulation();
  for (int k = 0; k < 2; ++k) {
    if (k == 1) sync.PrepareForFinalBackward();
    net.Loss(((int64_t{step} * 2 + k) * world + rank) * 2, 2).div(2).backward();
  }
  return sync.Wait();
}

struct Case {
  std::string name;
  bool adamw = true;
  // ClipGradNorm's max_norm: 1e9 never clips (the factor is exactly 1), 0.05 always does.
  double max_norm = 1e9;
};

class DistributedOptimizerTest : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(Optimizers, DistributedOptimizerTest,
                         ::testing::Values(Case{"adamw", true, 1e9}, Case{"sgd", false, 1e9},
                                           Case{"adamw_clipped", true, 0.05}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Four steps of the sharded optimizer against DataParallelGradSync with the same optimizer
// over the whole parameters. Each rank holds about 1/N of the optimizer state and no whole
// gradient, and the replicas end equal. Without clipping, 1 and 2 ranks give the same bits (the
// updates are elementwise and a + b is b + a); 3 and 4 ranks add the gradients in another order
// (see ShardedGradSync's test), and clipping scales by a norm summed in another grouping, so those
// agree within 1e-6 (a few float32 roundings of values of order 1).
TEST_P(DistributedOptimizerTest, MatchesTheSameOptimizerOverWholeParameters) {
  const Case& c = GetParam();
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("world=", world));
    std::vector<std::vector<at::Tensor>> expected(world), actual(world);
    std::vector<int64_t> state_numel(world);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      Net reference, net;
      KEEL_ASSIGN_OR_RETURN(auto dp, gradients::DataParallelGradSync::Create(reference, *r.group));
      std::unique_ptr<torch::optim::Optimizer> whole;
      if (c.adamw) {
        whole = std::make_unique<torch::optim::AdamW>(reference.parameters(), Adam());
      } else {
        whole = std::make_unique<torch::optim::SGD>(reference.parameters(), Sgd());
      }
      gradients::DataParallelGradSyncOptions options;
      options.bucket_cap_mb = 1e-3;  // a few buckets
      KEEL_ASSIGN_OR_RETURN(
          auto sharded, DistributedOptimizer::Create(net, *r.group,
                                                     c.adamw ? Factory<torch::optim::AdamW>(Adam())
                                                             : Factory<torch::optim::SGD>(Sgd()),
                                                     options));
      for (int step = 0; step < 4; ++step) {
        KEEL_RETURN_IF_ERROR(Backward(reference, *dp, step, r.rank, world));
        KEEL_RETURN_IF_ERROR(
            gradients::ClipGradNorm(c.max_norm, gradients::TrainableParameters({&reference}))
                .status());
        whole->step();
        whole->zero_grad();
        KEEL_RETURN_IF_ERROR(Backward(net, *sharded, step, r.rank, world));
        // The optimizer owns the float32 gradients: they went into its buckets, and no whole
        // .grad stays beside them.
        for (const at::Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
        KEEL_RETURN_IF_ERROR(
            gradients::ClipGradNorm(c.max_norm, sharded->ShardParameters()).status());
        KEEL_RETURN_IF_ERROR(sharded->Step());
        sharded->ZeroGrad();
      }
      for (const at::Tensor& p : reference.parameters()) expected[r.rank].push_back(p.clone());
      for (const at::Tensor& p : net.parameters()) actual[r.rank].push_back(p.clone());
      for (const ParamShard& shard : sharded->shards()) state_numel[r.rank] += shard.tensor.numel();
      return absl::OkStatus();
    }));
    const bool exact = world <= 2 && c.max_norm > 1e6;
    int64_t total = 0;
    for (const at::Tensor& p : expected[0]) total += p.numel();
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      EXPECT_NEAR(state_numel[rank], double(total) / world, 12);  // within a row of 12
      for (size_t i = 0; i < actual[0].size(); ++i) {
        SCOPED_TRACE(absl::StrCat("parameter ", i));
        EXPECT_TRUE(at::equal(actual[rank][i], actual[0][i]));  // the replicas agree
        if (exact) {
          EXPECT_TRUE(at::equal(actual[rank][i], expected[rank][i]));
        } else {
          EXPECT_TRUE(at::allclose(actual[rank][i], expected[rank][i], 1e-6, 1e-6));
        }
      }
    }
  }
}

// The optimizer state lives only where the rows are: AdamW's moments have each shard's shape.
TEST(DistributedOptimizerTest, AdamWStateHasTheShardsShapes) {
  KEEL_ASSERT_OK(RunOnRanks(3, [&](Rank& r) -> absl::Status {
    Net net;
    KEEL_ASSIGN_OR_RETURN(auto sharded, DistributedOptimizer::Create(
                                            net, *r.group, Factory<torch::optim::AdamW>(Adam())));
    KEEL_RETURN_IF_ERROR(Backward(net, *sharded, 0, r.rank, 3));
    KEEL_RETURN_IF_ERROR(sharded->Step());
    for (const ParamShard& shard : sharded->shards()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(
          *sharded->optimizer().state().at(base::OptimizerStateKeyOf(shard.tensor)));
      EXPECT_EQ(state.exp_avg().sizes(), shard.tensor.sizes()) << shard.name;
      EXPECT_EQ(state.exp_avg_sq().sizes(), shard.tensor.sizes()) << shard.name;
      EXPECT_EQ(state.step(), 1);
    }
    return absl::OkStatus();
  }));
}

// SGD whose step throws, as a step that fails on one rank (out of memory, a bad state).
class ThrowingSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure) override {
    TORCH_CHECK(false, "injected step failure");
    return torch::optim::SGD::step(std::move(closure));
  }
};

// A step that throws on one rank still joins the all-gather, and every rank fails at once:
// the thrower with its error, its peers naming it (not a timeout in the next collective).
TEST(DistributedOptimizerTest, AStepThatThrowsOnOneRankFailsEveryRankWithoutWaiting) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world=", world));
    std::vector<absl::Status> statuses(world);
    KEEL_ASSERT_OK(RunOnRanks(
        world,
        [&](Rank& r) -> absl::Status {
          Net net;
          const bool thrower = r.rank == 1;
          KEEL_ASSIGN_OR_RETURN(
              auto optimizer, DistributedOptimizer::Create(
                                  net, *r.group, [thrower](const std::vector<ParamShard>& shards) {
                                    std::unique_ptr<torch::optim::Optimizer> o;
                                    if (thrower) {
                                      o = std::make_unique<ThrowingSgd>(Tensors(shards), Sgd());
                                    } else {
                                      o = std::make_unique<torch::optim::SGD>(Tensors(shards),
                                                                              Sgd());
                                    }
                                    return o;
                                  }));
          KEEL_RETURN_IF_ERROR(Backward(net, *optimizer, /*step=*/0, r.rank, world));
          statuses[r.rank] = optimizer->Step();
          return absl::OkStatus();
        },
        /*timeout=*/std::chrono::seconds(30)));
    EXPECT_THAT(statuses[1], StatusIs(StatusCode::kInternal, HasSubstr("injected step failure")));
    for (int rank = 0; rank < world; ++rank) {
      if (rank == 1) continue;
      EXPECT_THAT(
          statuses[rank],
          StatusIs(StatusCode::kAborted, "rank 1 failed the parameter all-gather; see its error"));
    }
  }
}

TEST(DistributedOptimizerTest, AFactoryThatDoesNotStepEachShardOnceIsRefused) {
  struct Bad {
    ShardOptimizerFactory factory;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {[](const std::vector<ParamShard>&) { return nullptr; }, "returned no optimizer"},
      {[](const std::vector<ParamShard>& shards) {
         return std::make_unique<torch::optim::LBFGS>(Tensors(shards));
       },
       "LBFGS and other types are not supported"},
      {[](const std::vector<ParamShard>& shards) {
         std::vector<at::Tensor> tensors = Tensors(shards);
         tensors.pop_back();
         return std::make_unique<torch::optim::SGD>(tensors, Sgd());
       },
       "does not hold the shard of 'w2'"},
      {[](const std::vector<ParamShard>& shards) {
         std::vector<at::Tensor> tensors = Tensors(shards);
         tensors.push_back(tensors.front());
         return std::make_unique<torch::optim::SGD>(tensors, Sgd());
       },
       "params[4] is a shard's tensor listed twice"},
      {[](const std::vector<ParamShard>& shards) {
         return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{at::ones({2})}, Sgd());
       },
       "params[0] is not a shard's tensor"},
  };
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.message);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      Net net;
      EXPECT_THAT(DistributedOptimizer::Create(net, *r.group, bad.factory),
                  StatusIs(StatusCode::kInvalidArgument, HasSubstr(bad.message)));
      return absl::OkStatus();
    }));
  }
}

}  // namespace
}  // namespace keel::optim
