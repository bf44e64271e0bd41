// Tensor parallelism on real Gloo ranks (threads): the collectives and their gradients (those of
// sequence parallelism too), and a small model of every layer (vocabulary-parallel embedding,
// attention with its heads split, column- and row-parallel MLP, a vocabulary-parallel head and
// cross-entropy) on 2 ranks, with and without sequence parallelism, its weights copied from the
// same model on one rank, gives that model's loss and, slice for slice, its gradients; on a
// device group (the NCCL-like group of a fake GPU's tensors) no host
// tensor is exchanged.
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/comm_timers.h"
#include "parallel/layout.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/utils.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;
using ::keel::testing::RunOnRanksNcclLike;
using ::testing::ElementsAre;
using ::testing::Pair;

TEST(MappingsTest, EachCollectiveAndItsGradient) {
  CommTimers timers;
  CommTimers::Scope counting(timers);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    c10d::ProcessGroup* tp = r.group.get();
    const double k = r.rank + 1;  // rank 0 holds 1s, rank 1 holds 2s
    at::Tensor x = at::full({2, 4}, k).requires_grad_(true);
    // Copy: identity forward; backward sums the ranks' gradients (1 + 2 = 3 per element).
    (CopyToTensorParallelRegion(x, tp) * k).sum().backward();
    EXPECT_TRUE(at::equal(x.grad(), at::full({2, 4}, 3.0)));
    x.mutable_grad().reset();
    // Reduce: the sum forward; identity backward.
    at::Tensor reduced = ReduceFromTensorParallelRegion(x, tp);
    EXPECT_TRUE(at::equal(reduced, at::full({2, 4}, 3.0)));
    (reduced * k).sum().backward();
    EXPECT_TRUE(at::equal(x.grad(), at::full({2, 4}, k)));
    x.mutable_grad().reset();
    // Scatter then gather: this rank's half of the last dimension, then all of it back.
    at::Tensor whole = at::arange(8, at::kFloat).view({2, 4}).requires_grad_(true);
    at::Tensor half = ScatterToTensorParallelRegion(whole, tp);
    EXPECT_TRUE(at::equal(half, whole.detach().narrow(1, 2 * r.rank, 2)));
    at::Tensor back = GatherFromTensorParallelRegion(half, tp);
    EXPECT_TRUE(at::equal(back, whole.detach()));
    (back * k).sum().backward();  // each rank's gradient of its half is its own k
    EXPECT_TRUE(at::equal(whole.grad().narrow(1, 2 * r.rank, 2), at::full({2, 2}, k)));
    return absl::OkStatus();
  }));
  // The time they took counts, as tensor parallelism's.
  EXPECT_GT(timers.Seconds(CommKind::kTensorParallel), 0.0);
  EXPECT_EQ(timers.Seconds(CommKind::kPipeline), 0.0);
}

// Sequence parallelism's collectives along Keel's sequence (dimension 1), on an even and an odd
// number of ranks, each rank holding 2 positions.
TEST(MappingsTest, EachSequenceParallelCollectiveAndItsGradient) {
  for (const int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("world_size=", world));
    CommTimers timers;
    CommTimers::Scope counting(timers);
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      c10d::ProcessGroup* tp = r.group.get();
      const double k = r.rank + 1;                     // rank r's gradients are r + 1
      const double sum_k = world * (world + 1) / 2.0;  // their sum over the ranks
      const at::Tensor values = at::arange(2 * 2 * world * 3, at::kFloat).view({2, 2 * world, 3});
      const at::Tensor mine = values.narrow(1, 2 * r.rank, 2);
      // Each rank's positions of the gradient, rank q's q + 1.
      const auto expect_ranks_gradients = [&](const at::Tensor& grad) {
        for (int q = 0; q < world; ++q) {
          EXPECT_TRUE(at::equal(grad.narrow(1, 2 * q, 2), at::full({2, 2, 3}, q + 1.0))) << q;
        }
      };
      // Scatter: this rank's positions; the backward gathers every rank's gradient.
      const at::Tensor whole = values.clone().requires_grad_(true);
      const at::Tensor chunk = ScatterToSequenceParallelRegion(whole, tp);
      EXPECT_TRUE(at::equal(chunk, mine));
      (chunk * k).sum().backward();
      expect_ranks_gradients(whole.grad());
      // Gather: every rank's positions in rank order; the backward sums the ranks' gradients of
      // this rank's positions (reduce-scatter), or keeps this rank's own (a whole gradient).
      for (const bool partial : {true, false}) {
        const at::Tensor part = mine.clone().requires_grad_(true);
        const at::Tensor gathered = GatherFromSequenceParallelRegion(part, tp, partial);
        EXPECT_TRUE(at::equal(gathered, values));
        (gathered * k).sum().backward();
        EXPECT_TRUE(at::equal(part.grad(), at::full({2, 2, 3}, partial ? sum_k : k)));
      }
      // Reduce-scatter: this rank's positions of the sum; the backward gathers the gradients.
      const at::Tensor scaled = (values * k).requires_grad_(true);
      const at::Tensor reduced = ReduceScatterToSequenceParallelRegion(scaled, tp);
      EXPECT_TRUE(at::equal(reduced, mine * sum_k));
      (reduced * k).sum().backward();
      expect_ranks_gradients(scaled.grad());
      return absl::OkStatus();
    }));
    EXPECT_GT(timers.Seconds(CommKind::kTensorParallel), 0.0);
  }
}

// The column-parallel product under sequence parallelism, which keeps only this rank's share of
// the sequence for the backward pass, gives what autograd gives through the gather: the output
// and the gradients of the input, of this rank's rows of the weight and of the bias; with a
// frozen weight, the input's alone.
TEST(MappingsTest, LinearWithGradAccumulationIsTheLinearOfTheGatheredSequence) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    c10d::ProcessGroup* tp = r.group.get();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/r.rank);
    const at::Tensor input = at::randn({2, 3, 4}, generator, at::kFloat);
    const at::Tensor weight = at::randn({5, 4}, generator, at::kFloat);
    const at::Tensor bias = at::randn({5}, generator, at::kFloat);
    const at::Tensor weights = at::randn({2, 6, 5}, generator, at::kFloat);  // the loss's
    for (const bool frozen : {false, true}) {
      SCOPED_TRACE(frozen ? "frozen weight" : "trained weight");
      std::vector<at::Tensor> ours = {input.clone().requires_grad_(true),
                                      weight.clone().requires_grad_(!frozen),
                                      bias.clone().requires_grad_(!frozen)};
      std::vector<at::Tensor> reference = {input.clone().requires_grad_(true),
                                           weight.clone().requires_grad_(!frozen),
                                           bias.clone().requires_grad_(!frozen)};
      const at::Tensor out = LinearWithGradAccumulation(ours[0], {ours[1]}, ours[2], tp);
      const at::Tensor expected = at::linear(GatherFromSequenceParallelRegion(reference[0], tp),
                                             reference[1], reference[2]);
      EXPECT_TRUE(at::allclose(out, expected, /*rtol=*/1e-6, /*atol=*/1e-6));
      (out * weights).sum().backward();
      (expected * weights).sum().backward();
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_EQ(ours[i].grad().defined(), reference[i].grad().defined()) << i;
        if (!ours[i].grad().defined()) continue;
        EXPECT_TRUE(at::allclose(ours[i].grad(), reference[i].grad(), 1e-5, 1e-6)) << i;
      }
    }
    return absl::OkStatus();
  }));
}

// On a device group (an NcclLikeGroup: tensors on the fake GPU, host tensors refused as NCCL
// refuses them) the collectives, their gradients and the vocabulary-parallel loss exchange no
// host tensor, and give what they give over Gloo.
TEST(MappingsTest, OnADeviceGroupNoHostTensorIsExchanged) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/2);
  const at::Tensor logits = at::randn({3, 5, 16}, generator, at::kFloat);
  const at::Tensor target = at::arange(15, at::kLong).mul(5).remainder(16).view({3, 5});
  const at::Tensor whole = logits.clone().requires_grad_(true);
  const at::Tensor reference =
      at::cross_entropy_loss(whole.view({-1, 16}), target.view({-1}), {}, at::Reduction::None);
  reference.sum().backward();
  KEEL_ASSERT_OK(RunOnRanksNcclLike(2, [&](Rank& r) -> absl::Status {
    c10d::ProcessGroup* tp = r.group.get();
    const double k = r.rank + 1;  // rank 0 holds 1s, rank 1 holds 2s
    at::Tensor x = at::full({2, 4}, k).to(r.device).requires_grad_(true);
    (CopyToTensorParallelRegion(x, tp) * k).sum().backward();
    EXPECT_TRUE(at::equal(x.grad().cpu(), at::full({2, 4}, 3.0)));
    at::Tensor reduced = ReduceFromTensorParallelRegion(x, tp);
    EXPECT_TRUE(at::equal(reduced.cpu(), at::full({2, 4}, 3.0)));
    at::Tensor halves = at::arange(8, at::kFloat).view({2, 4}).to(r.device).requires_grad_(true);
    at::Tensor back = GatherFromTensorParallelRegion(ScatterToTensorParallelRegion(halves, tp), tp);
    EXPECT_TRUE(at::equal(back.cpu(), at::arange(8, at::kFloat).view({2, 4})));
    (back * k).sum().backward();
    EXPECT_TRUE(at::equal(halves.grad().cpu().narrow(1, 2 * r.rank, 2), at::full({2, 2}, k)));
    // Along the sequence: scatter, then gather keeping this rank's gradient.
    at::Tensor positions =
        at::arange(8, at::kFloat).view({1, 4, 2}).to(r.device).requires_grad_(true);
    at::Tensor again = GatherFromSequenceParallelRegion(
        ScatterToSequenceParallelRegion(positions, tp), tp, /*tensor_parallel_output_grad=*/false);
    EXPECT_TRUE(at::equal(again.cpu(), at::arange(8, at::kFloat).view({1, 4, 2})));
    (again * k).sum().backward();
    EXPECT_TRUE(at::equal(positions.grad().cpu().narrow(1, 2 * r.rank, 2), at::full({1, 2, 2}, k)));

    // Each rank holds half of the vocabulary's logits.
    at::Tensor mine = logits.chunk(2, -1)[r.rank].contiguous().to(r.device).requires_grad_(true);
    const at::Tensor loss = VocabParallelCrossEntropy(mine, target.to(r.device), tp);
    loss.sum().backward();
    // As the one-rank loss, up to the order of the sums over the vocabulary's halves.
    EXPECT_TRUE(at::allclose(loss.cpu().view({-1}), reference, /*rtol=*/1e-6, /*atol=*/1e-6));
    EXPECT_TRUE(at::allclose(mine.grad().cpu(), whole.grad().chunk(2, -1)[r.rank],
                             /*rtol=*/1e-5, /*atol=*/1e-6));
    return absl::OkStatus();
  }));
}

// Every layer of tensor_parallel, and the vocabulary-parallel loss; with sequence_parallel the
// residual stream holds this rank's share of the sequence, the head gathering it.
class TinyImpl : public torch::nn::Module {
 public:
  explicit TinyImpl(c10d::ProcessGroup* tp, bool sequence_parallel = false) : tp_(tp) {
    embed_ = register_module("embed", VocabParallelEmbedding(16, 8, tp, sequence_parallel));
    attn_ = register_module("attn", ParallelSelfAttention(8, 4, tp, sequence_parallel));
    fc_ = register_module("fc", ColumnParallelLinear(8, 12, tp, /*bias=*/true,
                                                     /*gather_output=*/false, sequence_parallel));
    proj_ =
        register_module("proj", RowParallelLinear(12, 8, tp, /*bias=*/true,
                                                  /*input_is_parallel=*/true, sequence_parallel));
    head_ =
        register_module("head", ColumnParallelLinear(8, 16, tp, /*bias=*/false,
                                                     /*gather_output=*/false, sequence_parallel));
  }
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor x = embed_->forward(tokens);
    x = x + attn_->forward(x, /*packed=*/nullptr);
    x = x + proj_->forward(at::gelu(fc_->forward(x)));
    return VocabParallelCrossEntropy(head_->forward(x), targets, tp_).sum();
  }

 private:
  c10d::ProcessGroup* tp_;
  VocabParallelEmbedding embed_{nullptr};
  ParallelSelfAttention attn_{nullptr};
  ColumnParallelLinear fc_{nullptr};
  RowParallelLinear proj_{nullptr};
  ColumnParallelLinear head_{nullptr};
};
TORCH_MODULE(Tiny);

// A model on one rank. (A bare nullptr would make the holder empty: name the null group.)
Tiny OneRank() {
  c10d::ProcessGroup* const no_group = nullptr;
  return Tiny(no_group);
}

Tiny WholeModel() {
  Tiny whole = OneRank();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
  at::NoGradGuard no_grad;
  for (at::Tensor& p : whole->parameters()) p.normal_(0.0, 0.3, generator);
  return whole;
}

const at::Tensor& Tokens() {
  static const at::Tensor* const tokens =
      new at::Tensor(at::arange(12, at::kLong).mul(7).remainder(16).view({2, 6}));
  return *tokens;
}

// A model built under MetaParameters takes no memory; its names and shapes are the steps of
// the whole model's initialisation. Run one parameter at a time on two ranks (a step of a
// parameter neither holds, another pipeline stage's, drawn first), they give each rank its
// block of the whole model initialised in place by the same draws.
TEST(TensorParallelLayersTest, InitialisingFromWholeStepsGivesTheWholeModelsBlocks) {
  std::vector<WholeInitStep> steps = {{"elsewhere.weight", {3, 5}, at::kFloat, 0.5}};
  {
    MetaParameters meta;
    const Tiny described = OneRank();
    for (const auto& item : described->named_parameters()) {
      EXPECT_TRUE(item.value().is_meta()) << item.key();
      const bool weight = absl::EndsWith(item.key(), "weight");
      steps.push_back({item.key(), item.value().sizes().vec(), at::kFloat, weight ? 0.02 : 0.0});
    }
  }
  EXPECT_FALSE(OneRank()->parameters()[0].is_meta());
  Tiny whole = OneRank();
  {
    at::NoGradGuard no_grad;
    torch::manual_seed(5);
    auto params = whole->named_parameters();
    for (const WholeInitStep& step : steps) {
      at::Tensor drawn = at::empty(step.shape);
      if (params.contains(step.name)) drawn = params[step.name];
      step.std > 0 ? drawn.normal_(0.0, step.std) : drawn.zero_();
    }
  }
  std::mutex generator;  // the ranks are threads sharing the default generator
  std::vector<std::vector<std::string>> differing(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Tiny model(r.group.get());
    {
      std::lock_guard<std::mutex> lock(generator);
      torch::manual_seed(5);
      KEEL_RETURN_IF_ERROR(InitialiseFromWholeSteps(*model, steps));
    }
    const std::map<std::string, TensorLayout> layouts = ParameterLayouts(*model);
    const auto whole_params = whole->named_parameters();
    for (const auto& item : model->named_parameters()) {
      at::Tensor expected = whole_params[item.key()];
      if (auto it = layouts.find(item.key()); it != layouts.end()) {
        expected = BlockOf(expected, it->second, item.value().sizes());
      }
      if (!at::equal(item.value(), expected)) differing[r.rank].push_back(item.key());
    }
    return absl::OkStatus();
  }));
  EXPECT_THAT(differing, ElementsAre(::testing::IsEmpty(), ::testing::IsEmpty()));
  steps.back().shape = {2, 2};
  Tiny model = OneRank();
  EXPECT_THAT(InitialiseFromWholeSteps(*model, steps),
              keel::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      ::testing::HasSubstr(steps.back().name)));
}

// A model built on the meta device only to describe itself draws nothing: a step of 2^32
// values (16 GiB were it drawn) passes at once and leaves the generator where it was.
TEST(TensorParallelLayersTest, AMetaModelDrawsNothing) {
  std::vector<WholeInitStep> steps = {{"elsewhere.weight", {1 << 16, 1 << 16}, at::kFloat, 0.5}};
  MetaParameters meta;
  Tiny model = OneRank();
  for (const auto& item : model->named_parameters()) {
    steps.push_back({item.key(), item.value().sizes().vec(), at::kFloat, 0.02});
  }
  torch::manual_seed(5);
  const at::Tensor expected = at::randn({4});
  torch::manual_seed(5);
  KEEL_ASSERT_OK(InitialiseFromWholeSteps(*model, steps));
  EXPECT_TRUE(at::equal(at::randn({4}), expected));
}

// Two ranks (splitting the sequence too with `sequence_parallel`, the gradients of the
// parameters that then see half of it summed over them) give the whole model's loss and, slice
// for slice, its gradients.
void ExpectTwoRanksGiveTheWholeModelsLossAndGradients(bool sequence_parallel) {
  Tiny whole = WholeModel();
  const at::Tensor targets = Tokens().roll(-1, 1);
  const at::Tensor whole_loss = whole->Loss(Tokens(), targets);
  whole_loss.backward();
  std::vector<double> losses(2);
  std::vector<std::map<std::string, std::string>> mismatches(2);
  std::vector<std::vector<std::string>> summed(2);
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Tiny model(r.group.get(), sequence_parallel);
    KEEL_RETURN_IF_ERROR(CopyFromWholeModel(*model, *whole));
    const at::Tensor loss = model->Loss(Tokens(), targets);
    loss.backward();
    losses[r.rank] = loss.item<double>();
    auto parameters = model->named_parameters();
    summed[r.rank] = SequenceParallelParameters(*model);
    for (const std::string& name : summed[r.rank]) {
      at::Tensor grad = parameters[name].grad();
      AllReduceInPlace(grad, r.group.get());
    }
    const std::map<std::string, TensorLayout> layouts = ParameterLayouts(*model);
    const auto whole_params = whole->named_parameters();
    for (const auto& item : parameters) {
      at::Tensor expected = whole_params[item.key()].grad();
      if (auto it = layouts.find(item.key()); it != layouts.end()) {
        expected = BlockOf(expected, it->second, item.value().sizes());
      }
      if (!at::allclose(item.value().grad(), expected, /*rtol=*/1e-5, /*atol=*/1e-6)) {
        mismatches[r.rank][item.key()] = "gradient differs";
      }
    }
    return absl::OkStatus();
  }));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NEAR(losses[rank], whole_loss.item<double>(),
                1e-6 * std::abs(whole_loss.item<double>()));
    EXPECT_TRUE(mismatches[rank].empty()) << mismatches[rank].begin()->first;
    // The row-parallel biases, added after the reduce-scatter, see half of the sequence.
    const std::vector<std::string> expected =
        sequence_parallel ? std::vector<std::string>{"attn.proj.bias", "proj.bias"}
                          : std::vector<std::string>{};
    EXPECT_EQ(summed[rank], expected);
  }
}

TEST(TensorParallelLayersTest, TwoRanksGiveTheWholeModelsLossAndGradients) {
  ExpectTwoRanksGiveTheWholeModelsLossAndGradients(/*sequence_parallel=*/false);
}

TEST(TensorParallelLayersTest, SequenceParallelRanksGiveTheWholeModelsLossAndGradients) {
  ExpectTwoRanksGiveTheWholeModelsLossAndGradients(/*sequence_parallel=*/true);
}

// Every layer moved to the fake GPU, over a device group (an NcclLikeGroup, which refuses host
// tensors as NCCL does), with and without sequence parallelism: no host tensor is exchanged,
// forward or backward, and the loss and every gradient are those of the same ranks over Gloo, up
// to rounding (the fake GPU runs the CPU's kernels, or LibTorch's generic ones).
TEST(TensorParallelLayersTest, OnADeviceGroupTheLayersExchangeNoHostTensor) {
  Tiny whole = WholeModel();
  const at::Tensor targets = Tokens().roll(-1, 1);
  for (const bool sequence_parallel : {false, true}) {
    SCOPED_TRACE(sequence_parallel ? "sequence-parallel" : "tensor-parallel");
    const auto run = [&](std::vector<at::Tensor>& losses,
                         std::vector<std::map<std::string, at::Tensor>>& grads) {
      return [&](Rank& r) -> absl::Status {
        Tiny model(r.group.get(), sequence_parallel);
        KEEL_RETURN_IF_ERROR(CopyFromWholeModel(*model, *whole));
        model->to(r.device);
        const at::Tensor loss = model->Loss(Tokens().to(r.device), targets.to(r.device));
        loss.backward();
        losses[r.rank] = loss.detach().cpu();
        for (const auto& item : model->named_parameters()) {
          grads[r.rank][item.key()] = item.value().grad().cpu();
        }
        return absl::OkStatus();
      };
    };
    std::vector<at::Tensor> host_losses(2), device_losses(2);
    std::vector<std::map<std::string, at::Tensor>> host(2), device(2);
    KEEL_ASSERT_OK(RunOnRanks(2, run(host_losses, host)));
    KEEL_ASSERT_OK(RunOnRanksNcclLike(2, run(device_losses, device)));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(at::allclose(device_losses[rank], host_losses[rank], /*rtol=*/1e-6, /*atol=*/0));
      for (const auto& [name, grad] : host[rank]) {
        EXPECT_TRUE(at::allclose(device[rank].at(name), grad, /*rtol=*/1e-5, /*atol=*/1e-6))
            << "rank " << rank << ": " << name;
      }
    }
  }
}

TEST(TensorParallelLayersTest, OneRankIsTheOrdinaryCrossEntropy) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/2);
  const at::Tensor logits = at::randn({3, 5, 16}, generator, at::kFloat);
  const at::Tensor target = at::arange(15, at::kLong).remainder(16).view({3, 5});
  const at::Tensor weights = at::rand({3, 5}, generator, at::kFloat);  // the loss's gradient
  const at::Tensor reference_logits = logits.clone().requires_grad_();
  const at::Tensor reference = at::cross_entropy_loss(reference_logits.view({-1, 16}),
                                                      target.view({-1}), {}, at::Reduction::None);
  (reference * weights.view({-1})).sum().backward();
  // float32 logits, and bf16 ones (float32 losses, a bf16 gradient).
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor input = logits.to(dtype);
    const double tolerance = dtype == at::kFloat ? 1e-6 : 2e-2;
    const at::Tensor reference_rounded = at::cross_entropy_loss(
        input.to(at::kFloat).view({-1, 16}), target.view({-1}), {}, at::Reduction::None);
    const at::Tensor ours_logits = input.clone().requires_grad_();
    const at::Tensor ours = VocabParallelCrossEntropy(ours_logits, target, nullptr);
    EXPECT_EQ(ours.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(ours.view({-1}), reference_rounded, 1e-6, 1e-6));
    (ours * weights).sum().backward();
    EXPECT_EQ(ours_logits.grad().scalar_type(), dtype);
    EXPECT_TRUE(at::allclose(ours_logits.grad().to(at::kFloat), reference_logits.grad(), tolerance,
                             tolerance));
  }
}

TEST(TensorParallelLayersTest, LayoutsNameTheShardedParametersOnly) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    Tiny model(r.group.get());
    const std::map<std::string, TensorLayout> layouts = ParameterLayouts(*model);
    std::vector<std::string> names;
    for (const auto& [name, layout] : layouts) names.push_back(name);
    // proj.bias and attn.proj.bias are whole (added after the sum); nothing else is.
    EXPECT_THAT(names,
                ElementsAre("attn.proj.weight", "attn.qkv.bias", "attn.qkv.weight", "embed.weight",
                            "fc.bias", "fc.weight", "head.weight", "proj.weight"));
    EXPECT_EQ(layouts.at("proj.weight").global_shape, (std::vector<int64_t>{8, 12}));
    EXPECT_EQ(layouts.at("proj.weight").offsets, (std::vector<int64_t>{0, 6 * r.rank}));
    EXPECT_EQ(layouts.at("embed.weight").offsets, (std::vector<int64_t>{8 * r.rank, 0}));
    EXPECT_TRUE(ParameterLayouts(*OneRank()).empty());  // one rank: nothing to lay out
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace keel::parallel
