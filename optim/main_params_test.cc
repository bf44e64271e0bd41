// Megatron's mixed precision in the data-parallel optimizer, on real Gloo ranks (threads): bf16
// parameters, float32 main gradients summed over the micro-batches and averaged over the ranks,
// float32 main parameters stepped by AdamW and rounded into the bf16 parameters. Every path
// (one rank without a group, 2 ranks unsharded, 2 ranks with the distributed optimizer) steps
// the weights a hand-written loop computes from the same gradients, to the bit; main gradients
// on float32 parameters step as the plain path does.
#include <memory>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "gmock/gmock.h"
#include "gradients/parameters.h"
#include "gtest/gtest.h"
#include "optim/data_parallel_optimizer.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"
#include "torch/optim/adamw.h"

namespace keel::optim {
namespace {

using ::keel::gradients::NamedParameter;
using ::keel::gradients::TrainableParameters;
using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::testing::HasSubstr;

constexpr int kSteps = 3;
constexpr int kMicroBatches = 2;

// A layer over a 9-row embedding in `dtype`, deterministic without the global generator.
class Net : public torch::nn::Module {
 public:
  explicit Net(at::ScalarType dtype) {
    embed_ = register_parameter("embed",
                                at::arange(36, at::kFloat).mul(0.3).sin().view({9, 4}).to(dtype));
    w_ = register_parameter("w", at::arange(12, at::kFloat).mul(0.7).cos().view({3, 4}).to(dtype));
    b_ = register_parameter("b", at::full({3}, 0.01).to(dtype));
  }
  // Mean squared output of samples [first, first + count), in the parameters' dtype.
  at::Tensor Loss(int64_t first, int64_t count) const {
    const at::Tensor tokens = at::arange(first, first + count, at::kLong).remainder(9);
    return embed_.index_select(0, tokens).matmul(w_.t()).add(b_).tanh().pow(2).mean();
  }
  // Rank `rank`'s micro-batch `k` of step `step` (out of `world` ranks), scaled for the mean.
  at::Tensor MicroBatchLoss(int step, int rank, int k, int world) const {
    return Loss(((step * world + rank) * kMicroBatches + k) * 2, 2).div(kMicroBatches);
  }

 private:
  at::Tensor embed_, w_, b_;
};

torch::optim::AdamWOptions Options() { return torch::optim::AdamWOptions(0.05).weight_decay(0.1); }

OptimizerFactory AdamW() {
  return [](const std::vector<NamedParameter>& params) {
    std::vector<at::Tensor> tensors;
    for (const NamedParameter& p : params) tensors.push_back(p.param);
    return std::make_unique<torch::optim::AdamW>(tensors, Options());
  };
}

std::vector<at::Tensor> Weights(const Net& net) {
  std::vector<at::Tensor> weights;
  for (const at::Tensor& p : net.parameters()) weights.push_back(p.detach().clone());
  return weights;
}

// Megatron's recipe written out for `world` ranks in one process, without Keel: each rank's
// bf16 gradients summed in float32 over its micro-batches, the ranks' sums added and divided
// by the world size, AdamW on float32 copies, the copies rounded into the bf16 weights.
std::vector<at::Tensor> Reference(int world) {
  std::vector<std::unique_ptr<Net>> nets;
  for (int r = 0; r < world; ++r) nets.push_back(std::make_unique<Net>(at::kBFloat16));
  std::vector<at::Tensor> main;
  for (const at::Tensor& p : nets[0]->parameters()) main.push_back(p.detach().to(at::kFloat));
  torch::optim::AdamW adamw(main, Options());
  for (int step = 0; step < kSteps; ++step) {
    std::vector<at::Tensor> average(main.size());
    for (int r = 0; r < world; ++r) {
      std::vector<at::Tensor> sum(main.size());
      for (int k = 0; k < kMicroBatches; ++k) {
        nets[r]->zero_grad();
        nets[r]->MicroBatchLoss(step, r, k, world).backward();
        const std::vector<at::Tensor> params = nets[r]->parameters();
        for (size_t i = 0; i < main.size(); ++i) {
          const at::Tensor grad = params[i].grad().to(at::kFloat);
          sum[i] = sum[i].defined() ? sum[i] + grad : grad;
        }
      }
      for (size_t i = 0; i < main.size(); ++i) {
        average[i] = average[i].defined() ? average[i] + sum[i] : sum[i];
      }
    }
    for (size_t i = 0; i < main.size(); ++i) main[i].mutable_grad() = average[i] / world;
    adamw.step();
    at::NoGradGuard no_grad;
    for (const auto& net : nets) {
      const std::vector<at::Tensor> params = net->parameters();
      for (size_t i = 0; i < main.size(); ++i) params[i].copy_(main[i]);
    }
  }
  return Weights(*nets[0]);
}

DataParallelOptimizerOptions MainGradOptions(bool shard) {
  DataParallelOptimizerOptions options;
  options.use_distributed_optimizer = shard;
  options.sync.main_grad_dtype = at::kFloat;
  return options;
}

// Trains `net` on rank `rank` of `world`; checks on the way that the parameters' own gradients
// are freed after every backward pass.
absl::StatusOr<std::vector<at::Tensor>> Train(Net& net, DataParallelOptimizer& optimizer, int rank,
                                              int world) {
  for (int step = 0; step < kSteps; ++step) {
    optimizer.PrepareForGradAccumulation();
    for (int k = 0; k < kMicroBatches; ++k) {
      if (k + 1 == kMicroBatches) optimizer.PrepareForFinalBackward();
      net.MicroBatchLoss(step, rank, k, world).backward();
      for (const at::Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
    }
    KEEL_RETURN_IF_ERROR(optimizer.Wait());
    for (const NamedParameter& p : optimizer.StepParameters()) {
      EXPECT_EQ(p.param.scalar_type(), at::kFloat);
      EXPECT_EQ(p.param.grad().scalar_type(), at::kFloat);
    }
    KEEL_RETURN_IF_ERROR(optimizer.ClipGradNorm(1e9).status());
    KEEL_RETURN_IF_ERROR(optimizer.Step());
  }
  return Weights(net);
}

void ExpectEqualWeights(const std::vector<at::Tensor>& actual,
                        const std::vector<at::Tensor>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].scalar_type(), expected[i].scalar_type());
    EXPECT_TRUE(at::equal(actual[i], expected[i]))
        << "parameter " << i << ": "
        << (actual[i].to(at::kFloat) - expected[i].to(at::kFloat)).abs().max().item<double>();
  }
}

TEST(MainParamsTest, OneRankStepsMegatronsRecipe) {
  Net net(at::kBFloat16);
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr, AdamW(),
                                                    MainGradOptions(false)));
  EXPECT_TRUE(optimizer->has_main_copies());
  EXPECT_EQ(optimizer->Describe(), "AdamW over float32 main parameters");
  KEEL_ASSERT_OK_AND_ASSIGN(const std::vector<at::Tensor> weights, Train(net, *optimizer, 0, 1));
  ExpectEqualWeights(weights, Reference(1));
  // The main gradients' sum, taken only when asked (the non-finite guard's question).
  EXPECT_TRUE(optimizer->LocalGradientSum().defined());
}

TEST(MainParamsTest, TwoRanksStepMegatronsRecipeShardedOrNot) {
  const std::vector<at::Tensor> expected = Reference(2);
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "distributed optimizer" : "data-parallel sync");
    std::vector<std::vector<at::Tensor>> weights(2);
    std::vector<std::string> descriptions(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      Net net(at::kBFloat16);
      KEEL_ASSIGN_OR_RETURN(
          auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), r.group.get(),
                                                        AdamW(), MainGradOptions(shard)));
      KEEL_ASSIGN_OR_RETURN(weights[r.rank], Train(net, *optimizer, r.rank, 2));
      descriptions[r.rank] = optimizer->Describe();
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) ExpectEqualWeights(weights[rank], expected);
    EXPECT_THAT(descriptions[0], HasSubstr("AdamW over float32 main parameters"));
  }
}

// Main gradients on float32 parameters: no copies (the optimizer steps the parameters), and
// the same weights as DDP's gradients in .grad, to the bit: the same sums in the same order.
TEST(MainParamsTest, MainGradientsOnFloat32ParametersStepAsThePlainPath) {
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "distributed optimizer" : "data-parallel sync");
    std::vector<std::vector<at::Tensor>> plain(2), main(2);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      for (bool main_grads : {false, true}) {
        Net net(at::kFloat);
        DataParallelOptimizerOptions options = MainGradOptions(shard);
        if (!main_grads) options.sync.main_grad_dtype.reset();
        KEEL_ASSIGN_OR_RETURN(auto optimizer,
                              DataParallelOptimizer::Create(TrainableParameters({&net}),
                                                            r.group.get(), AdamW(), options));
        EXPECT_FALSE(optimizer->has_main_copies());
        std::vector<at::Tensor>& out = (main_grads ? main : plain)[r.rank];
        for (int step = 0; step < kSteps; ++step) {
          optimizer->PrepareForGradAccumulation();
          for (int k = 0; k < kMicroBatches; ++k) {
            if (k + 1 == kMicroBatches) optimizer->PrepareForFinalBackward();
            net.MicroBatchLoss(step, r.rank, k, 2).backward();
          }
          KEEL_RETURN_IF_ERROR(optimizer->Wait());
          KEEL_RETURN_IF_ERROR(optimizer->Step());
        }
        out = Weights(net);
      }
      return absl::OkStatus();
    }));
    for (int rank = 0; rank < 2; ++rank) ExpectEqualWeights(main[rank], plain[rank]);
  }
}

// Loading main copies and rounding them into the model, and the other way.
TEST(MainParamsTest, MainCopiesAndTheModelTradeValues) {
  Net net(at::kBFloat16);
  KEEL_ASSERT_OK_AND_ASSIGN(
      auto optimizer, DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr, AdamW(),
                                                    MainGradOptions(false)));
  const at::Tensor main = optimizer->StepParameters()[1].param;  // "w"
  at::Tensor w = net.parameters()[1];
  {
    at::NoGradGuard no_grad;
    main.fill_(1.0 + 1.0 / 1024);  // between two bf16 values: rounds to 1
  }
  KEEL_ASSERT_OK(optimizer->CopyMainToModel());
  EXPECT_TRUE(at::equal(w, at::ones_like(w)));
  EXPECT_EQ(main[0][0].item<float>(), 1.0f + 1.0f / 1024);  // the truth stays in float32
  {
    at::NoGradGuard no_grad;
    w.fill_(0.5);
  }
  optimizer->CopyModelToMain();
  EXPECT_TRUE(at::equal(main, at::full_like(main, 0.5)));
}

TEST(MainParamsTest, ANonFloatingMainGradientDtypeIsRefused) {
  Net net(at::kBFloat16);
  DataParallelOptimizerOptions options = MainGradOptions(false);
  options.sync.main_grad_dtype = at::kInt;
  EXPECT_THAT(
      DataParallelOptimizer::Create(TrainableParameters({&net}), nullptr, AdamW(), options),
      testing::StatusIs(absl::StatusCode::kInvalidArgument,
                        HasSubstr("main_grad_dtype must be a floating-point dtype, got Int")));
}

}  // namespace
}  // namespace keel::optim
