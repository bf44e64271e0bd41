// The output layer and the loss over chunks of positions (LinearCrossEntropy) against ATen's
// cross-entropy of the whole logits: on one rank at every chunk length (dividing the positions
// or not, longer than them), with vocabulary padding, a frozen weight and bf16; and on 2 real
// Gloo ranks, each holding its vocabulary slice (one of them padding alone), in float32 and bf16.
// On a GPU, bf16 logits' loss and gradient (Keel's kernels under --config=cuda) against the same
// on the CPU, on one rank and two, whole and chunked.
#include "parallel/tensor_parallel/cross_entropy.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "gtest/gtest.h"
#include "parallel/tensor_parallel/mappings.h"
#include "testing/ranks.h"
#include "testing/status_matchers.h"
#include "torch/cuda.h"

namespace keel::parallel {
namespace {

using ::keel::testing::Rank;
using ::keel::testing::RunOnRanks;

constexpr int64_t kVocab = 16, kHidden = 6;

// Hidden states [2, 5, h], the output weight [vocab, h], targets among the first `real`
// columns, and the loss's gradient at each position (a loss mask times a scale).
struct Problem {
  at::Tensor hidden, weight, target, grad_loss;
  explicit Problem(int64_t real) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/3);
    hidden = at::randn({2, 5, kHidden}, generator, at::kFloat);
    weight = at::randn({kVocab, kHidden}, generator, at::kFloat);
    target = at::arange(10, at::kLong).mul(7).remainder(real).view({2, 5});
    grad_loss =
        at::rand({2, 5}, generator, at::kFloat).mul(at::arange(10).remainder(3).ne(0).view({2, 5}));
  }
};

// ATen's cross-entropy over the real columns' logits, and its gradients.
struct Reference {
  at::Tensor losses, grad_hidden, grad_weight;
  Reference(const Problem& p, int64_t real) {
    const at::Tensor hidden = p.hidden.clone().requires_grad_(true);
    const at::Tensor weight = p.weight.clone().requires_grad_(true);
    const at::Tensor logits = at::linear(hidden, weight.narrow(0, 0, real));
    losses = at::cross_entropy_loss(logits.view({-1, real}), p.target.view({-1}), {},
                                    at::Reduction::None)
                 .view({2, 5});
    (losses * p.grad_loss).sum().backward();
    losses = losses.detach();
    grad_hidden = hidden.grad();
    grad_weight = weight.grad();
  }
};

void ExpectClose(const at::Tensor& ours, const at::Tensor& reference, double tolerance) {
  ASSERT_TRUE(ours.defined());
  EXPECT_TRUE(at::allclose(ours.to(at::kFloat), reference, tolerance, tolerance))
      << "ours\n"
      << ours << "\nreference\n"
      << reference;
}

TEST(LinearCrossEntropyTest, EveryChunkLengthIsTheWholeLogitsLoss) {
  for (const int64_t real : {kVocab, int64_t{13}}) {
    const Problem p(real);
    const Reference reference(p, real);
    for (const int64_t chunk_len : {0, 1, 3, 4, 10, 64}) {
      SCOPED_TRACE(::testing::Message() << "real columns " << real << ", chunk_len " << chunk_len);
      const at::Tensor hidden = p.hidden.clone().requires_grad_(true);
      const at::Tensor weight = p.weight.clone().requires_grad_(true);
      const at::Tensor losses =
          LinearCrossEntropy(hidden, weight, p.target, nullptr, {chunk_len, real});
      EXPECT_EQ(losses.scalar_type(), at::kFloat);
      ExpectClose(losses, reference.losses, 1e-5);
      (losses * p.grad_loss).sum().backward();
      ExpectClose(hidden.grad(), reference.grad_hidden, 1e-5);
      ExpectClose(weight.grad().narrow(0, 0, real), reference.grad_weight.narrow(0, 0, real), 1e-5);
      // The padding rows take no part: no gradient.
      EXPECT_TRUE(at::equal(weight.grad().narrow(0, real, kVocab - real),
                            at::zeros({kVocab - real, kHidden})));
    }
  }
}

// LoRA's frozen output layer: the hidden states still get their gradient.
TEST(LinearCrossEntropyTest, AFrozenWeightGetsNoGradientAndTheHiddenStatesTheirs) {
  const Problem p(kVocab);
  const Reference reference(p, kVocab);
  const at::Tensor hidden = p.hidden.clone().requires_grad_(true);
  const at::Tensor losses = LinearCrossEntropy(hidden, p.weight, p.target, nullptr, {3, {}});
  (losses * p.grad_loss).sum().backward();
  ExpectClose(hidden.grad(), reference.grad_hidden, 1e-5);
  EXPECT_FALSE(p.weight.grad().defined());
}

// bf16 logits (Megatron's bf16): float32 losses and gradients in bf16, chunked as whole.
TEST(LinearCrossEntropyTest, Bf16ChunksAreTheWholeBf16Logits) {
  const Problem p(kVocab);
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> losses;
  for (const int64_t chunk_len : {0, 4}) {
    const at::Tensor hidden = p.hidden.to(at::kBFloat16).requires_grad_(true);
    const at::Tensor weight = p.weight.to(at::kBFloat16).requires_grad_(true);
    const at::Tensor ours = LinearCrossEntropy(hidden, weight, p.target, nullptr, {chunk_len, {}});
    EXPECT_EQ(ours.scalar_type(), at::kFloat);
    (ours * p.grad_loss).sum().backward();
    EXPECT_EQ(weight.grad().scalar_type(), at::kBFloat16);
    losses.push_back(ours.detach());
    grads.push_back(hidden.grad().to(at::kFloat));
    grads.push_back(weight.grad().to(at::kFloat));
  }
  ExpectClose(losses[1], losses[0], 1e-5);
  ExpectClose(grads[2], grads[0], 2e-2);
  ExpectClose(grads[3], grads[1], 2e-2);
}

// Two ranks, each with its 8 rows of the vocabulary, the last 3 of rank 1's padding (or all 8 of
// them, a slice without a real entry): the losses, the hidden states' gradient (summed by the
// input region) and each rank's slice of the weight's gradient are the one-rank reference's,
// and the padding rows get none.
TEST(LinearCrossEntropyTest, TwoRanksGiveTheOneRankLossAndGradients) {
  constexpr int64_t kRows = kVocab / 2;
  for (const int64_t real : {int64_t{13}, kRows}) {
    const Problem p(real);
    const Reference reference(p, real);
    KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
      for (const int64_t chunk_len : {0, 3}) {
        SCOPED_TRACE(::testing::Message() << "real " << real << ", rank " << r.rank
                                          << ", chunk_len " << chunk_len);
        const at::Tensor hidden = p.hidden.clone().requires_grad_(true);
        const at::Tensor weight =
            p.weight.narrow(0, r.rank * kRows, kRows).clone().requires_grad_(true);
        const at::Tensor losses =
            LinearCrossEntropy(CopyToTensorParallelRegion(hidden, r.group.get()), weight, p.target,
                               r.group.get(), {chunk_len, real - r.rank * kRows});
        ExpectClose(losses, reference.losses, 1e-5);
        (losses * p.grad_loss).sum().backward();
        ExpectClose(hidden.grad(), reference.grad_hidden, 1e-5);
        const int64_t real_rows = std::clamp<int64_t>(real - r.rank * kRows, 0, kRows);
        ExpectClose(weight.grad().narrow(0, 0, real_rows),
                    reference.grad_weight.narrow(0, r.rank * kRows, real_rows), 1e-5);
        EXPECT_TRUE(weight.grad().narrow(0, real_rows, kRows - real_rows).eq(0).all().item<bool>());
      }
      return absl::OkStatus();
    }));
  }
}

// bf16 on two ranks (the logits kept in bf16, float32 losses, bf16 gradients) as on one rank,
// chunked and whole.
TEST(LinearCrossEntropyTest, Bf16OnTwoRanksIsBf16OnOne) {
  constexpr int64_t kRows = kVocab / 2;
  const Problem p(kVocab);
  const at::Tensor hidden = p.hidden.to(at::kBFloat16), weight = p.weight.to(at::kBFloat16);
  const at::Tensor one_hidden = hidden.clone().requires_grad_(true);
  const at::Tensor one_weight = weight.clone().requires_grad_(true);
  const at::Tensor one = LinearCrossEntropy(one_hidden, one_weight, p.target, nullptr, {0, {}});
  (one * p.grad_loss).sum().backward();
  KEEL_ASSERT_OK(RunOnRanks(2, [&](Rank& r) -> absl::Status {
    for (const int64_t chunk_len : {0, 4}) {
      SCOPED_TRACE(::testing::Message() << "rank " << r.rank << ", chunk_len " << chunk_len);
      const at::Tensor mine_hidden = hidden.clone().requires_grad_(true);
      const at::Tensor mine_weight =
          weight.narrow(0, r.rank * kRows, kRows).clone().requires_grad_(true);
      const at::Tensor losses =
          LinearCrossEntropy(CopyToTensorParallelRegion(mine_hidden, r.group.get()), mine_weight,
                             p.target, r.group.get(), {chunk_len, {}});
      EXPECT_EQ(losses.scalar_type(), at::kFloat);
      ExpectClose(losses, one.detach(), 1e-5);
      (losses * p.grad_loss).sum().backward();
      EXPECT_EQ(mine_weight.grad().scalar_type(), at::kBFloat16);
      ExpectClose(mine_hidden.grad(), one_hidden.grad().to(at::kFloat), 2e-2);
      ExpectClose(mine_weight.grad(),
                  one_weight.grad().narrow(0, r.rank * kRows, kRows).to(at::kFloat), 2e-2);
    }
    return absl::OkStatus();
  }));
}

// bf16 logits on a GPU (with --config=cuda Keel's kernels) give the loss and gradient that the
// same logits give on the CPU (ATen's fused log-softmax), at the trainer's vocabulary sizes,
// with padding columns at -inf.
TEST(VocabParallelCrossEntropyTest, OnAGpuBf16LogitsGiveTheCpusLossAndGradient) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: the CUDA path is not checked here";
#ifndef KEEL_CUDA_KERNELS
  GTEST_SKIP() << "built without --config=cuda: Keel's cross-entropy kernels are not in this build";
#endif
  const at::Device gpu(at::kCUDA, 0);
  for (const int64_t vocab : {int64_t{7}, int64_t{50304}, int64_t{128256}}) {
    SCOPED_TRACE(vocab);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/vocab);
    const int64_t real = vocab - 2;
    const at::Tensor logits =
        at::randn({3, 37, vocab}, generator, at::kFloat).mul(4).to(at::kBFloat16);
    const at::Tensor target = at::randint(real, {3, 37}, generator, at::kLong);
    const at::Tensor grad_loss = at::rand({3, 37}, generator, at::kFloat);
    std::vector<at::Tensor> losses, grads;
    for (const at::Device device : {at::Device(at::kCPU), gpu}) {
      const at::Tensor leaf = logits.to(device).requires_grad_(true);
      const at::Tensor loss =
          VocabParallelCrossEntropy(WithoutPadding(leaf, real), target.to(device), nullptr);
      (loss * grad_loss.to(device)).sum().backward();
      losses.push_back(loss.detach().cpu());
      grads.push_back(leaf.grad().cpu().to(at::kFloat));
    }
    EXPECT_EQ(losses[1].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(losses[1], losses[0], /*rtol=*/1e-5, /*atol=*/1e-5));
    // Each gradient rounded to bf16 from float32 values within float rounding: one bf16 step.
    EXPECT_TRUE(at::allclose(grads[1], grads[0], /*rtol=*/8e-3, /*atol=*/1e-7));
    EXPECT_TRUE(grads[1].narrow(-1, real, vocab - real).eq(0).all().item<bool>());
  }
}

// ||ours - reference|| <= relative x ||reference||: for gradients summed over many bf16 terms
// in different orders on two devices.
void ExpectNear(const at::Tensor& ours, const at::Tensor& reference, double relative) {
  ASSERT_TRUE(ours.defined());
  const at::Tensor a = ours.cpu().to(at::kFloat), b = reference.cpu().to(at::kFloat);
  EXPECT_LE((a - b).norm().item<double>(), relative * b.norm().item<double>());
}

// bf16 on a GPU (with --config=cuda Keel's kernels), whole and chunked, on one rank and on two
// (Gloo carrying the GPU's tensors), against the same on the CPU (ATen's composition), at
// GPT-2's padded vocabulary with its padding columns. The logits are exact in bf16 on both
// devices (small multiples of 1/8), so that only the float32 sums' orders differ.
TEST(LinearCrossEntropyTest, OnAGpuBf16SlicesGiveTheCpusLossAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: the CUDA path is not checked here";
#ifndef KEEL_CUDA_KERNELS
  GTEST_SKIP() << "built without --config=cuda: Keel's cross-entropy kernels are not in this build";
#endif
  constexpr int64_t kPadded = 50304, kReal = 50257, kWidth = 8;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/5);
  const at::Tensor hidden = at::randint(-1, 2, {2, 37, kWidth}, generator).to(at::kBFloat16);
  const at::Tensor weight =
      at::randint(-4, 5, {kPadded, kWidth}, generator).div(8).to(at::kBFloat16);
  const at::Tensor target = at::randint(kReal, {2, 37}, generator, at::kLong);
  const at::Tensor grad_loss = at::rand({2, 37}, generator, at::kFloat);
  const at::Device gpu(at::kCUDA, 0);
  for (const int world : {1, 2}) {
    KEEL_ASSERT_OK(RunOnRanks(world, [&](Rank& r) -> absl::Status {
      const int64_t rows = kPadded / world;
      for (const int64_t chunk_len : {0, 16}) {
        SCOPED_TRACE(::testing::Message()
                     << "rank " << r.rank << " of " << world << ", chunk_len " << chunk_len);
        std::vector<at::Tensor> losses, grad_hidden, grad_weight;
        for (const at::Device device : {at::Device(at::kCPU), gpu}) {
          const at::Tensor h = hidden.to(device).requires_grad_(true);
          const at::Tensor w = weight.narrow(0, r.rank * rows, rows).to(device).requires_grad_(true);
          const at::Tensor loss =
              LinearCrossEntropy(CopyToTensorParallelRegion(h, r.group.get()), w,
                                 target.to(device), r.group.get(),
                                 {chunk_len, kReal - r.rank * rows});
          (loss * grad_loss.to(device)).sum().backward();
          losses.push_back(loss.detach().cpu());
          grad_hidden.push_back(h.grad());
          grad_weight.push_back(w.grad());
        }
        EXPECT_EQ(losses[1].scalar_type(), at::kFloat);
        EXPECT_TRUE(at::allclose(losses[1], losses[0], /*rtol=*/1e-5, /*atol=*/1e-5));
        ExpectNear(grad_hidden[1], grad_hidden[0], 1e-2);
        ExpectNear(grad_weight[1], grad_weight[0], 1e-2);
        if (r.rank == world - 1) {
          const int64_t padding = kPadded - kReal;
          EXPECT_TRUE(grad_weight[1].narrow(0, rows - padding, padding).eq(0).all().item<bool>());
        }
      }
      return absl::OkStatus();
    }));
  }
}

}  // namespace
}  // namespace keel::parallel
