// The data-parallel optimizer's two paths on real Gloo ranks (threads): the sharded one steps
// the weights the unsharded one does (to the bit on 2 ranks without clipping), the same as one
// rank with the whole batch up to summation order; a skipped step changes nothing; Reset goes
// back to the options as built; a bad factory is refused naming what is wrong; on a device group
// (the NCCL-like group of a fake GPU's tensors) no host tensor is exchanged.
#include "optim/data_parallel_optimizer.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gradients/parameters.h"
#include "gtest/gtest.h"
#include "optim/fused_adamw.h"
#include "parallel/device_mesh.h"
#include "parallel/layout.h"
#include "parallel/mesh_layout.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/optim/adamw.h"
#include "torch/optim/lbfgs.h"
#include "torch/optim/sgd.h"

namespace keel::optim {
namespace {

using ::keel::gradients::NamedParameter;
using ::keel::gradients::TrainableParameters;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;

// A layer over a 9-row embedding, deterministic without the global generator.
class Net : public torch::nn::Module {
 public:
  Net() {
    embed_ = register_parameter("embed", at::arange(36, at::kFloat).mul(0.3).sin().view({9, 4}));
    w_ = register_parameter("w", at::arange(12, at::kFloat).mul(0.7).cos().view({3, 4}));
    b_ = register_parameter("b", at::zeros({3}));
  }
  // Mean squared output of samples [first, first + count).
  at::Tensor Loss(int64_t first, int64_t count) const {
    const at::Tensor tokens =
        at::arange(first, first + count, at::kLong).remainder(9).to(embed_.device());
    return embed_.index_select(0, tokens).matmul(w_.t()).add(b_).tanh().pow(2).mean();
  }

 private:
  at::Tensor embed_, w_, b_;
};

// AdamW with no weight decay on biases: two param groups, by name; `fused`: the FusedAdamW.
OptimizerFactory AdamW(bool fused = false) {
  return
      [fused](
          const std::vector<NamedParameter>& params) -> std::unique_ptr<torch::optim::Optimizer> {
        std::vector<at::Tensor> decayed, biases;
        for (const NamedParameter& p : params)
          (p.name == "b" ? biases : decayed).push_back(p.param);
        std::vector<torch::optim::OptimizerParamGroup> groups = {
            torch::optim::OptimizerParamGroup(decayed),
            torch::optim::OptimizerParamGroup(
                biases, std::make_unique<torch::optim::AdamWOptions>(
                            torch::optim::AdamWOptions(0.05).weight_decay(0)))};
        const auto defaults = torch::optim::AdamWOptions(0.05).weight_decay(0.1);
        if (fused) return *FusedAdamW::Create(std::move(groups), defaults);
        return std::make_unique<torch::optim::AdamW>(groups, defaults);
      };
}

std::vector<at::Tensor> Weights(const Net& net) {
  std::vector<at::Tensor> weights;
  for (const at::Tensor& p : net.parameters()) weights.push_back(p.detach().clone());
  return weights;
}

// Three steps: each of `world` ranks takes 4 samples a step, in two micro-batches.
absl::StatusOr<std::vector<at::Tensor>> Train(Net& net, DataParallelOptimizer& optimizer, int rank,
                                              int world) {
  for (int step = 0; step < 3; ++step) {
    optimizer.PrepareForGradAccumulation();
    for (int k = 0; k < 2; ++k) {
      if (k == 1) optimizer.PrepareForFinalBackward();
      net.Loss(((step * world + rank) * 2 + k) * 2, 2).div(2).backward();
    }
    KEEL_RETURN_IF_ERROR(optimizer.Wait());
    KEEL_RETURN_IF_ERROR(optimizer.ClipGradNorm(1e9).status());
    KEEL_RETURN_IF_ERROR(optimizer.Step());
  }
  return Weights(net);
}

// Each of 2 Gloo ranks trains a Net with `factory`'s optimizer unsharded, then sharded: the
// weights of each run per rank, and the sharded optimizer's description per rank.
struct BothPaths {
  std::vector<std::vector<at::Tensor>> whole{2}, sharded{2};
  std::vector<std::string> descriptions{2};
};
absl::StatusOr<BothPaths> TrainBothPaths(const OptimizerFactory& factory) {
  BothPaths out;
  KEEL_RETURN_IF_ERROR(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    for (bool shard : {false, true}) {
      Net net;
      DataParallelOptimizerOptions options;
      options.use_distributed_optimizer = shard;
      KEEL_ASSIGN_OR_RETURN(
          auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), r.group.get(),
                                                        factory, options));
      EXPECT_EQ(optimizer->sharded() != nullptr, shard);
      KEEL_ASSIGN_OR_RETURN((shard ? out.sharded : out.whole)[r.rank],
                            Train(net, *optimizer, r.rank, 2));
      if (shard) out.descriptions[r.rank] = optimizer->Describe();
    }
    return absl::OkStatus();
  }));
  return out;
}

TEST(DataParallelOptimizerTest, ShardedAndUnshardedStepAlike) {
  KEEL_ASSERT_OK_AND_ASSIGN(const BothPaths paths, TrainBothPaths(AdamW()));
  const auto& [whole, sharded, descriptions] = paths;
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < whole[0].size(); ++i) {
      EXPECT_TRUE(at::equal(whole[rank][i], whole[0][i]));    // the replicas agree
      EXPECT_TRUE(at::equal(sharded[rank][i], whole[0][i]));  // a + b is b + a: to the bit
    }
  }
  // 36 + 12 + 3 = 51 elements, about half of each bucket on each rank.
  EXPECT_THAT(descriptions[0], HasSubstr("AdamW sharded over the data-parallel ranks ("));
  EXPECT_THAT(descriptions[0], HasSubstr(" of 51 parameters' state here)"));

  // One rank, no group: nothing to average.
  Net net;
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto alone, DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr, AdamW()));
  EXPECT_EQ(alone->Describe(), "AdamW");
  EXPECT_FALSE(alone->LocalGradientSum().defined());  // no gradients yet
  // Its gradients as they are: every element 0.25, one of them a 2.
  double expected = 0.0;
  for (const gradients::NamedParameter& p : alone->parameters()) {
    at::Tensor param = p.param;
    param.mutable_grad() = at::full_like(param, 0.25);
    expected += 0.25 * static_cast<double>(param.numel());
  }
  alone->parameters().front().param.grad().view({-1})[0] = 2.0;
  EXPECT_EQ(alone->LocalGradientSum().item<double>(), expected + 1.75);
}

// The fused AdamW (the GPU default) steps the distributed optimizer's row shards as it steps
// the whole parameters, to float32 rounding: its CPU kernel runs a vectorized body and a scalar
// tail that may round an element apart, and a shard moves elements between the two (measured:
// 7.5e-9 on one weight of about 1 after 3 steps, the only difference). The replicas agree to the
// bit.
TEST(DataParallelOptimizerTest, TheFusedAdamWStepsShardsAsWholeParameters) {
  KEEL_ASSERT_OK_AND_ASSIGN(const BothPaths paths, TrainBothPaths(AdamW(/*fused=*/true)));
  const auto& [whole, sharded, descriptions] = paths;
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < whole[0].size(); ++i) {
      EXPECT_TRUE(at::equal(whole[rank][i], whole[0][i]));
      EXPECT_TRUE(at::equal(sharded[rank][i], sharded[0][i]));
      EXPECT_TRUE(at::allclose(sharded[rank][i], whole[0][i], /*rtol=*/1e-6, /*atol=*/1e-7))
          << "parameter " << i << ": "
          << (sharded[rank][i] - whole[0][i]).abs().max().item<double>();
    }
  }
}

// On a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them), both paths (the buckets' all-reduce; the reduce-scatter, sharded AdamW and
// all-gather) exchange no host tensor and step the weights of the same ranks over Gloo (the fake
// GPU runs the CPU's kernels, or LibTorch's generic ones: up to a few float32 roundings).
TEST(DataParallelOptimizerTest, OnADeviceGroupNoHostTensorIsExchanged) {
  const auto train = [](std::vector<std::vector<at::Tensor>>& weights, bool shard) {
    return [&weights, shard](Rank& r) -> absl::Status {
      Net net;
      net.to(r.device);
      DataParallelOptimizerOptions options;
      options.use_distributed_optimizer = shard;
      KEEL_ASSIGN_OR_RETURN(
          auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), r.group.get(),
                                                        AdamW(), options));
      KEEL_ASSIGN_OR_RETURN(weights[r.rank], Train(net, *optimizer, r.rank, 2));
      for (at::Tensor& weight : weights[r.rank]) weight = weight.cpu();
      return absl::OkStatus();
    };
  };
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "distributed optimizer" : "data-parallel sync");
    std::vector<std::vector<at::Tensor>> host(2), device(2);
    KEEL_ASSERT_OK(RunOnRanks(2, train(host, shard)));
    KEEL_ASSERT_OK(RunOnRanksNcclLike(2, train(device, shard)));
    for (int rank = 0; rank < 2; ++rank) {
      for (size_t i = 0; i < host[rank].size(); ++i) {
        EXPECT_TRUE(at::allclose(device[rank][i], host[rank][i], /*rtol=*/1e-5, /*atol=*/1e-6))
            << "rank " << rank << " parameter " << i;
      }
    }
  }
}

// SGD with a learning rate of 1: a step subtracts the averaged gradient.
OptimizerFactory PlainSgd() {
  return [](const std::vector<NamedParameter>& params) {
    std::vector<at::Tensor> tensors;
    for (const NamedParameter& p : params) tensors.push_back(p.param);
    return std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(1.0));
  };
}

// On 4 ranks with ep = 2 (Megatron's expert grid: ep groups {0, 1} {2, 3}, expert data
// parallel {0, 2} {1, 3}), dense gradients average over all 4 ranks and expert ones (a layout
// dimension "ep") over the ranks holding the same experts; the distributed optimizer shards
// each over its group (some ranks' shards have no rows) and steps the same parameters.
TEST(DataParallelOptimizerTest, ExpertGradientsAverageOverTheExpertDataParallelGroup) {
  parallel::ModelParallelOptions sizes;
  sizes.expert_model_parallel_size = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(const parallel::MeshLayout layout,
                            parallel::MeshLayout::Create(sizes, 4));
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "distributed optimizer" : "whole parameters");
    std::vector<std::vector<float>> dense(4), expert(4);
    KEEL_ASSERT_OK(testing::RunOnRanksWithStore(4, [&](Rank& r) -> absl::Status {
      KEEL_ASSIGN_OR_RETURN(
          const parallel::DeviceMesh mesh,
          parallel::DeviceMesh::Create(layout, r.rank, r.store, parallel::Backend::kGloo,
                                       std::chrono::seconds(20)));
      c10d::ProcessGroup* ep = mesh.Group(parallel::GroupKind::kEp);
      const at::Tensor w = at::zeros({3}).requires_grad_(true);
      const at::Tensor e = at::zeros({1, 3}).requires_grad_(true);  // this rank's expert
      KEEL_ASSIGN_OR_RETURN(
          parallel::TensorLayout e_layout,
          parallel::EvenlySharded({2, 3}, {{"ep", ep, parallel::Placement::Shard(0)}}));
      DataParallelOptimizerOptions options;
      options.use_distributed_optimizer = sharded;
      options.expert_dim_name = "ep";
      options.expert_data_parallel_group = mesh.Group(parallel::GroupKind::kExpertDp);
      KEEL_ASSIGN_OR_RETURN(
          auto optimizer,
          DataParallelOptimizer::Create({{"w", w}, {"experts", e, e_layout}},
                                        mesh.Group(parallel::GroupKind::kDp), PlainSgd(), options));
      EXPECT_EQ(optimizer->sharded() != nullptr, sharded);
      if (sharded) {
        EXPECT_THAT(optimizer->Describe(),
                    HasSubstr("SGD sharded over the data-parallel ranks, experts over the expert "
                              "data-parallel ones ("));
      }
      optimizer->PrepareForFinalBackward();
      ((w.sum() + e.sum()) * (r.rank + 1)).backward();
      KEEL_RETURN_IF_ERROR(optimizer->Wait());
      KEEL_RETURN_IF_ERROR(optimizer->Step());
      dense[r.rank] = std::vector<float>(w.data_ptr<float>(), w.data_ptr<float>() + 3);
      expert[r.rank] = std::vector<float>(e.data_ptr<float>(), e.data_ptr<float>() + 3);
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE(rank);
      EXPECT_THAT(dense[rank], ::testing::Each(-2.5f));  // -(1 + 2 + 3 + 4) / 4
      // -(1 + 3) / 2 on ranks 0 and 2, -(2 + 4) / 2 on ranks 1 and 3.
      EXPECT_THAT(expert[rank], ::testing::Each(rank % 2 == 0 ? -2.0f : -3.0f));
    }
  }
}

TEST(DataParallelOptimizerTest, ShardedExpertParametersNeedTheirGroup) {
  KEEL_ASSERT_OK(RunOnRanks(1, [&](Rank& r) -> absl::Status {
    Net net;
    std::vector<NamedParameter> params = TrainableParameters({&net});
    params[0].layout = parallel::BlockLayout({9, 4}, {0, 0});
    params[0].layout->dims.push_back({"ep", nullptr, parallel::Placement::Shard(0)});
    DataParallelOptimizerOptions sharded;
    sharded.use_distributed_optimizer = true;
    sharded.expert_dim_name = "ep";
    EXPECT_THAT(
        DataParallelOptimizer::Create(params, r.group.get(), AdamW(), sharded),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 HasSubstr("parameters ('embed' and 0 other(s)) to shard without a group")));
    return absl::OkStatus();
  }));
}

TEST(DataParallelOptimizerTest, SkipStepChangesNothingAndResetRestoresTheOptions) {
  Net net;
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr, AdamW()));
  const std::vector<at::Tensor> before = Weights(net);
  net.Loss(0, 4).backward();
  optimizer->SkipStep();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(Weights(net)[i], before[i]));
  EXPECT_TRUE(optimizer->optimizer().state().empty());

  net.Loss(0, 4).backward();
  KEEL_ASSERT_OK(optimizer->Step());
  optimizer->optimizer().param_groups()[0].options().set_lr(7.0);  // as a schedule would
  EXPECT_FALSE(optimizer->optimizer().state().empty());
  optimizer->Reset();
  EXPECT_TRUE(optimizer->optimizer().state().empty());
  EXPECT_EQ(optimizer->optimizer().param_groups()[0].options().get_lr(), 0.05);
  EXPECT_EQ(
      static_cast<torch::optim::AdamWOptions&>(optimizer->optimizer().param_groups()[1].options())
          .weight_decay(),
      0.0);
}

TEST(DataParallelOptimizerTest, AFactoryThatDoesNotHoldEachParameterOnceIsRefused) {
  Net net;
  EXPECT_THAT(DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr,
                                            [](const std::vector<NamedParameter>& params) {
                                              return std::make_unique<torch::optim::AdamW>(
                                                  std::vector<at::Tensor>{params[0].param});
                                            }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not hold the parameter of 'w'")));
  EXPECT_THAT(DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr,
                                            [](const std::vector<NamedParameter>& params) {
                                              std::vector<at::Tensor> tensors;
                                              for (const auto& p : params)
                                                tensors.push_back(p.param);
                                              return std::make_unique<torch::optim::LBFGS>(tensors);
                                            }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("LBFGS")));
}

}  // namespace
}  // namespace keel::optim
