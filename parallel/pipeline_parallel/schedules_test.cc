// The 1F1B order against Megatron's warm-up / steady / cool-down counts, and a small model split
// over 2 and 4 real Gloo stages (threads) giving, bit for bit, the one-rank gradients; over a
// device group (the NCCL-like group of a fake GPU's tensors) nothing goes over the host.
#include "parallel/pipeline_parallel/schedules.h"

#include <map>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/comm_timers.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/nn/modules/linear.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Kind = PipelineAction::Kind;

constexpr PipelineAction F(int64_t i) { return {Kind::kForward, i}; }
constexpr PipelineAction B(int64_t i) { return {Kind::kBackward, i}; }

TEST(LayersOfStageTest, EvenSplitAndRefusals) {
  KEEL_ASSERT_OK_AND_ASSIGN(StageLayers second, LayersOfStage(8, 4, 1));
  EXPECT_EQ(second.first, 2);
  EXPECT_EQ(second.count, 2);
  EXPECT_THAT(LayersOfStage(5, 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("num_layers (5) must be a positive multiple of the pipeline "
                                 "stages (2)")));
  EXPECT_THAT(LayersOfStage(2, 4, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_layers (2)")));
}

TEST(OneFOneBScheduleTest, WarmupSteadyCooldownPerStage) {
  // 4 stages, 6 micro-batches: stage s warms up with 3 - s forwards.
  EXPECT_THAT(OneFOneBSchedule(6, 0, 4),
              ElementsAre(F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), B(3), B(4), B(5)));
  EXPECT_THAT(OneFOneBSchedule(6, 2, 4),
              ElementsAre(F(0), F(1), B(0), F(2), B(1), F(3), B(2), F(4), B(3), F(5), B(4), B(5)));
  EXPECT_THAT(OneFOneBSchedule(3, 3, 4), ElementsAre(F(0), B(0), F(1), B(1), F(2), B(2)));
  // Fewer micro-batches than stages: the warm-up is every forward.
  EXPECT_THAT(OneFOneBSchedule(2, 0, 4), ElementsAre(F(0), F(1), B(0), B(1)));
  EXPECT_THAT(OneFOneBSchedule(3, 0, 4, /*forward_only=*/true), ElementsAre(F(0), F(1), F(2)));
}

TEST(OneFOneBScheduleTest, KeepsAtMostTheStagesAfterItPlusOneInFlight) {
  for (int stages : {1, 2, 4, 8}) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int64_t m : {1, 3, 8, 16}) {
        int64_t live = 0;
        int64_t peak = 0;
        int64_t next_backward = 0;
        for (const PipelineAction& a : OneFOneBSchedule(m, stage, stages)) {
          if (a.kind == Kind::kForward) {
            peak = std::max(peak, ++live);
          } else {
            EXPECT_EQ(a.micro_batch, next_backward++);  // backwards in micro-batch order
            --live;
          }
        }
        EXPECT_EQ(next_backward, m);
        EXPECT_LE(peak, std::min<int64_t>(m, stages - stage));
      }
    }
  }
}

// A stack of `kLayers` linear layers with tanh, split evenly over the stages; the last stage
// adds a squared-error loss over the micro-batch.
constexpr int kLayers = 4;
constexpr int kWidth = 6;
constexpr int kMicroBatches = 5;

// The same weights on every rank, drawn from a generator of their own (the ranks are threads:
// the default generator would be raced for).
std::vector<torch::nn::Linear> Layers() {
  at::Generator generator = at::detail::createCPUGenerator(7);
  at::NoGradGuard no_grad;
  std::vector<torch::nn::Linear> layers;
  for (int i = 0; i < kLayers; ++i) {
    torch::nn::Linear layer(kWidth, kWidth);
    layer->weight.copy_(at::randn({kWidth, kWidth}, generator) / kWidth);
    layer->bias.copy_(at::randn({kWidth}, generator) / kWidth);
    layers.push_back(layer);
  }
  return layers;
}

at::Tensor Inputs(int64_t i) {
  return at::arange(3 * kWidth, at::kFloat).view({3, kWidth}) / (i + 7);
}

// The gradients of layer l's weight after every micro-batch's backward, by layer.
std::map<int, at::Tensor> TrainOnStages(c10d::ProcessGroup* pp, absl::Status* status) {
  const int stages = pp == nullptr ? 1 : pp->getSize();
  const int stage = pp == nullptr ? 0 : pp->getRank();
  std::vector<torch::nn::Linear> layers = Layers();
  const StageLayers mine = *LayersOfStage(kLayers, stages, stage);
  StageCallbacks callbacks;
  callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{3, kWidth}; };
  callbacks.forward = [&](int64_t i, const at::Tensor& input) {
    at::Tensor x = input.defined() ? input : Inputs(i);
    for (int64_t l = mine.first; l < mine.first + mine.count; ++l) {
      x = at::tanh(layers[l]->forward(x));
    }
    return stage == stages - 1 ? (x - 0.5).pow(2).sum() / kMicroBatches : x;
  };
  std::vector<int64_t> before_backward;
  callbacks.before_backward = [&](int64_t i) { before_backward.push_back(i); };
  *status = RunPipeline(kMicroBatches, callbacks, pp);
  EXPECT_THAT(before_backward, ElementsAre(0, 1, 2, 3, 4));  // each backward, in order
  std::map<int, at::Tensor> grads;
  for (int64_t l = mine.first; l < mine.first + mine.count; ++l) {
    grads[l] = layers[l]->weight.grad();
  }
  return grads;
}

TEST(RunPipelineTest, StagesGiveTheOneRankGradientsBitForBit) {
  absl::Status one_rank;
  const std::map<int, at::Tensor> expected = TrainOnStages(nullptr, &one_rank);
  KEEL_ASSERT_OK(one_rank);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kLayers));
  CommTimers timers;
  CommTimers::Scope counting(timers);
  for (int stages : {2, 4}) {
    std::vector<std::map<int, at::Tensor>> grads(stages);
    KEEL_ASSERT_OK(RunOnRanks(stages, [&](Rank& r) -> absl::Status {
      absl::Status status;
      grads[r.rank] = TrainOnStages(r.group.get(), &status);
      return status;
    }));
    int seen = 0;
    for (const auto& stage : grads) {
      for (const auto& [layer, grad] : stage) {
        EXPECT_TRUE(at::equal(grad, expected.at(layer))) << stages << " stages, layer " << layer;
        ++seen;
      }
    }
    EXPECT_EQ(seen, kLayers);
  }
  // The later stages waited for activations.
  EXPECT_GT(timers.Seconds(CommKind::kPipeline), 0.0);
  EXPECT_EQ(timers.Seconds(CommKind::kTensorParallel), 0.0);
}

TEST(RunPipelineTest, ForwardOnlyPassesActivationsAndKeepsNoGraph) {
  std::vector<double> outputs(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    StageCallbacks callbacks;
    callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{2}; };
    callbacks.forward = [&](int64_t i, const at::Tensor& input) {
      if (r.rank == 0) return at::full({2}, static_cast<double>(i + 1), at::kFloat);
      EXPECT_FALSE(input.requires_grad());
      outputs[i] = input.sum().item<double>();
      return input.sum();
    };
    PipelineOptions options;
    options.forward_only = true;
    return RunPipeline(2, callbacks, r.group.get(), options);
  }));
  EXPECT_THAT(outputs, ElementsAre(2.0, 4.0));
}

TEST(RunPipelineTest, AFailingStageIsAnErrorAndItsPeerTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::Status> statuses(2);
  const absl::Status all = RunOnRanks(
      2,
      [&](Rank& r) -> absl::Status {
        StageCallbacks callbacks;
        callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{2}; };
        callbacks.forward = [&](int64_t, const at::Tensor& input) -> at::Tensor {
          if (r.rank == 0) TORCH_CHECK(false, "the first stage's layer failed");
          return input.sum();
        };
        statuses[r.rank] = RunPipeline(1, callbacks, r.group.get());
        return absl::OkStatus();
      },
      std::chrono::seconds(2));
  KEEL_EXPECT_OK(all);
  EXPECT_THAT(statuses[0], StatusIs(absl::StatusCode::kInternal,
                                    HasSubstr("pipeline stage 0 of 2, micro-batch 1's forward: "
                                              "the first stage's layer failed")));
  EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kUnavailable,
                                    HasSubstr("pipeline stage 1 of 2, micro-batch 1's forward: "
                                              "exchanging with the neighbouring stages")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// A point-to-point transfer does not check what it carries: an activation of another dtype or
// shape than the next stage receives is refused by its sender, naming both, and the receiver
// times out (as it does for any failing peer) instead of reading garbage.
TEST(RunPipelineTest, AnActivationOfAnotherDtypeOrShapeIsRefusedNamingBoth) {
  const auto produced = [](int64_t i) {
    return i == 0 ? at::ones({2, 3}, at::kDouble) : at::ones({3, 2}, at::kFloat);
  };
  for (int64_t wrong : {0, 1}) {
    std::vector<absl::Status> statuses(2);
    KEEL_ASSERT_OK(RunOnRanks(
        2,
        [&](Rank& r) -> absl::Status {
          StageCallbacks callbacks;
          callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{2, 3}; };
          callbacks.forward = [&](int64_t i, const at::Tensor& input) -> at::Tensor {
            if (r.rank == 1) return input.sum();
            return i == wrong ? produced(wrong) : at::ones({2, 3}).requires_grad_(true);
          };
          statuses[r.rank] = RunPipeline(2, callbacks, r.group.get());
          return absl::OkStatus();
        },
        std::chrono::seconds(2)));
    EXPECT_THAT(statuses[1], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("stage 1 of 2")));
    EXPECT_THAT(statuses[0],
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("pipeline stage 0 of 2, micro-batch ", wrong + 1,
                                                "'s forward produced ",
                                                wrong == 0 ? "Double [2, 3]" : "Float [3, 2]",
                                                ", but stage 1 receives Float [2, 3]"))));
  }
}

// A stage whose loss does not depend on its input sends back the input's true gradient, zeros,
// so that the previous stage's receive is matched and its gradients are zero.
TEST(RunPipelineTest, AnInputTheLossIgnoresSendsBackAZeroGradient) {
  at::Tensor first_grad;
  KEEL_ASSERT_OK(RunOnRanks(
      2,
      [&](Rank& r) -> absl::Status {
        const at::Tensor weight = at::full({2}, 3.0).requires_grad_(true);
        StageCallbacks callbacks;
        callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{2}; };
        callbacks.forward = [&](int64_t, const at::Tensor&) -> at::Tensor {
          return r.rank == 0 ? weight * 2 : weight.sum();
        };
        KEEL_RETURN_IF_ERROR(RunPipeline(2, callbacks, r.group.get()));
        if (r.rank == 0) first_grad = weight.grad();
        return absl::OkStatus();
      },
      std::chrono::seconds(10)));
  ASSERT_TRUE(first_grad.defined());
  EXPECT_TRUE(at::equal(first_grad, at::zeros({2})));
}

// Over a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them) the stages exchange activations and gradients on the device and compute the
// gradients they compute over Gloo (up to rounding: the fake GPU runs the CPU's kernels, or
// LibTorch's generic ones); activations declared on the host are refused, naming the exchange,
// before any is sent.
TEST(RunPipelineTest, OverADeviceGroupActivationsAndGradientsStayOnTheDevice) {
  at::Generator generator = at::detail::createCPUGenerator(5);
  const at::Tensor weights = at::randn({2, kWidth, kWidth}, generator) / kWidth;
  const auto train = [&](std::vector<at::Tensor>& grads) {
    return [&](Rank& r) -> absl::Status {
      at::Tensor weight = weights[r.rank].to(r.device).requires_grad_(true);
      StageCallbacks callbacks;
      callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{3, kWidth}; };
      callbacks.forward = [&](int64_t i, const at::Tensor& input) {
        const at::Tensor x = input.defined() ? input : Inputs(i).to(r.device);
        const at::Tensor y = at::tanh(x.matmul(weight));
        return r.rank == 1 ? (y - 0.5).pow(2).sum() / kMicroBatches : y;
      };
      PipelineOptions options;
      options.activation_options = at::TensorOptions().dtype(at::kFloat).device(r.device);
      KEEL_RETURN_IF_ERROR(RunPipeline(kMicroBatches, callbacks, r.group.get(), options));
      grads[r.rank] = weight.grad().cpu();
      return absl::OkStatus();
    };
  };
  std::vector<at::Tensor> host(2), device(2);
  KEEL_ASSERT_OK(RunOnRanks(2, train(host)));
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, train(device)));
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_TRUE(at::allclose(device[stage], host[stage], /*rtol=*/1e-5, /*atol=*/1e-7))
        << "stage " << stage;
  }

  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [](Rank& r) -> absl::Status {
    StageCallbacks callbacks;
    callbacks.activation_shape = [](int64_t) { return std::vector<int64_t>{2}; };
    callbacks.forward = [](int64_t, const at::Tensor&) { return at::ones({2}); };
    EXPECT_THAT(RunPipeline(1, callbacks, r.group.get()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("the pipeline's activations and gradients: a host (cpu) tensor "
                                   "cannot go over a process group of backend \"nccl\"")));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::parallel
