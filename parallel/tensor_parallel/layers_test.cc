// ColumnParallelLinearImpl::ForwardStacked: the column-parallel layers that read one input,
// computed as one product of their stacked weights, give what each layer's forward gives and
// the same gradients, on one rank (biases, an adapter) and on two ranks under sequence
// parallelism (one gather instead of one a layer), keeping no stacked copy of the weights for
// backward; layers that do not match are refused.
#include "parallel/tensor_parallel/layers.h"

#include <memory>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "base/tensor_memory.h"
#include "gtest/gtest.h"
#include "parallel/tensor_parallel/mappings.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/nn/module.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;

// x B^T of the whole sequence: an adapter of a column-parallel layer with `rows` output rows.
class Projection : public LinearAdapter {
 public:
  Projection(int64_t input_size, int64_t rows, c10d::ProcessGroup* tp, bool sequence_parallel)
      : tp_(tp), sequence_parallel_(sequence_parallel) {
    b_ = register_parameter("b", at::zeros({rows, input_size}, at::kFloat));
  }
  at::Tensor forward(const at::Tensor& input) override {
    return at::linear(sequence_parallel_ ? GatherFromSequenceParallelRegion(input, tp_) : input,
                      b_);
  }

 private:
  c10d::ProcessGroup* tp_;
  bool sequence_parallel_;
  at::Tensor b_;
};

struct Layers {
  std::vector<ColumnParallelLinear> modules;
  std::vector<ColumnParallelLinearImpl*> raw() const {
    std::vector<ColumnParallelLinearImpl*> layers;
    for (const ColumnParallelLinear& m : modules) layers.push_back(m.ptr().get());
    return layers;
  }
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> all;
    for (const ColumnParallelLinear& m : modules) {
      for (const at::Tensor& p : m->parameters()) all.push_back(p);
    }
    return all;
  }
};

// Layers of `rows` output rows each over an input of 8, their parameters drawn from `seed`
// (the ranks are threads: a generator of its own, not the global one), the second one adapted
// when `adapter`.
Layers MakeLayers(const std::vector<int64_t>& rows, c10d::ProcessGroup* tp, bool sequence_parallel,
                  bool bias, bool adapter, uint64_t seed) {
  Layers layers;
  for (int64_t n : rows) {
    layers.modules.push_back(
        ColumnParallelLinear(8, n, tp, bias, /*gather_output=*/false, sequence_parallel));
  }
  if (adapter) {
    ColumnParallelLinear& second = layers.modules[1];
    second->Adapt(std::make_shared<Projection>(8, second->weight().size(0), tp, sequence_parallel));
  }
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : layers.parameters()) {
    p.copy_(at::randn(p.sizes(), generator, at::kFloat));
  }
  return layers;
}

// Runs `input` through `layers` one by one and stacked; the outputs and every gradient agree.
void ExpectStackedIsEachLayer(const at::Tensor& input, const std::vector<int64_t>& rows,
                              c10d::ProcessGroup* tp, bool sequence_parallel, bool bias,
                              bool adapter) {
  const Layers each = MakeLayers(rows, tp, sequence_parallel, bias, adapter, 7);
  const Layers stacked = MakeLayers(rows, tp, sequence_parallel, bias, adapter, 7);
  const at::Tensor x_each = input.clone().requires_grad_(true);
  const at::Tensor x_stacked = input.clone().requires_grad_(true);
  std::vector<at::Tensor> expected;
  for (ColumnParallelLinear m : each.modules) expected.push_back(m->forward(x_each));
  const std::vector<at::Tensor> actual =
      ColumnParallelLinearImpl::ForwardStacked(x_stacked, stacked.raw());
  ASSERT_EQ(actual.size(), expected.size());
  at::Tensor loss_each = at::zeros({}), loss_stacked = at::zeros({});
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i].sizes(), expected[i].sizes()) << i;
    EXPECT_TRUE(at::allclose(actual[i], expected[i], 1e-6, 1e-6)) << i;
    // A different weight for each output, so that mixing them up would show.
    const at::Tensor weights =
        at::arange(expected[i].numel(), at::kFloat).view(expected[i].sizes()).sin();
    loss_each = loss_each + (expected[i] * weights).sum();
    loss_stacked = loss_stacked + (actual[i] * weights).sum();
  }
  loss_each.backward();
  loss_stacked.backward();
  EXPECT_TRUE(at::allclose(x_stacked.grad(), x_each.grad(), 1e-5, 1e-6));
  const std::vector<at::Tensor> ours = stacked.parameters(), theirs = each.parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_TRUE(ours[i].grad().defined()) << i;
    EXPECT_TRUE(at::allclose(ours[i].grad(), theirs[i].grad(), 1e-5, 1e-6)) << i;
  }
}

TEST(ForwardStackedTest, OneRankGivesEachLayersOutputAndGradients) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
  const at::Tensor input = at::randn({2, 5, 8}, generator, at::kFloat);
  for (const bool bias : {false, true}) {
    for (const bool adapter : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bias " << bias << ", adapter " << adapter);
      ExpectStackedIsEachLayer(input, {6, 4, 4}, nullptr, /*sequence_parallel=*/false, bias,
                               adapter);
    }
  }
  ExpectStackedIsEachLayer(input, {3}, nullptr, false, /*bias=*/true, /*adapter=*/false);
}

TEST(ForwardStackedTest, SequenceParallelRanksGiveEachLayersOutputAndGradients) {
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/r.rank);
    const at::Tensor share = at::randn({2, 3, 8}, generator, at::kFloat);  // of 6 positions
    for (const bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(sequence_parallel ? "sequence parallel" : "tensor parallel");
      ExpectStackedIsEachLayer(share, {6, 4, 4}, r.group.get(), sequence_parallel,
                               /*bias=*/true, /*adapter=*/true);
    }
    return absl::OkStatus();
  }));
}

// Between forward and backward the stacked layers hold their product alone: backward stacks
// the weights again rather than keeping a stacked copy of them from forward.
TEST(ForwardStackedTest, KeepsNoStackedCopyOfTheWeights) {
  base::TrackTensorMemory(at::kCPU);
  const Layers layers =
      MakeLayers({6, 10}, nullptr, /*sequence_parallel=*/false, /*bias=*/false, false, 7);
  const at::Tensor x = at::zeros({3, 5, 8}, at::kFloat).requires_grad_(true);
  const int64_t before = base::TensorMemory(at::kCPU);
  const std::vector<at::Tensor> outputs = ColumnParallelLinearImpl::ForwardStacked(x, layers.raw());
  EXPECT_EQ(base::TensorMemory(at::kCPU) - before, 3 * 5 * (6 + 10) * 4);
  (outputs[0].sum() + outputs[1].sum()).backward();
  for (const at::Tensor& p : layers.parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(ForwardStackedTest, RefusesLayersThatDoNotMatch) {
  ColumnParallelLinear a(8, 4, nullptr, /*bias=*/true);
  ColumnParallelLinear other_input(6, 4, nullptr, /*bias=*/true);
  ColumnParallelLinear no_bias(8, 4, nullptr, /*bias=*/false);
  const at::Tensor input = at::zeros({1, 2, 8}, at::kFloat);
  EXPECT_THROW(ColumnParallelLinearImpl::ForwardStacked(input, {}), c10::Error);
  EXPECT_THROW(ColumnParallelLinearImpl::ForwardStacked(input, {a.get(), other_input.get()}),
               c10::Error);
  EXPECT_THROW(ColumnParallelLinearImpl::ForwardStacked(input, {a.get(), no_bias.get()}),
               c10::Error);
}

}  // namespace
}  // namespace keel::parallel
