// SwiGlu against Hugging Face's silu(gate) * up under ATen's autograd (models/hf_reference.h):
// the same bits forward and backward, in float32 and bf16, on gate and up as views of one
// product as GatedMlp hands them over; and one silu(gate) fewer kept for backward, counted by
// the CPU's tensor memory.
#include "models/gated_mlp.h"

#include <cstdint>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "base/tensor_memory.h"
#include "gtest/gtest.h"
#include "models/hf_reference.h"

namespace keel::models {
namespace {

constexpr int64_t kWidth = 96;

// gate and up as the two halves of one [3, 7, 2 x kWidth] product; a random upstream gradient.
struct Problem {
  at::Tensor gate_up, grad;
  explicit Problem(at::ScalarType dtype) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
    gate_up = at::randn({3, 7, 2 * kWidth}, generator, at::kFloat).mul(3).to(dtype);
    grad = at::randn({3, 7, kWidth}, generator, at::kFloat).to(dtype);
  }
};

struct Result {
  at::Tensor output, grad;
};

template <typename Fn>
Result ForwardAndBackward(const Problem& p, Fn activation) {
  const at::Tensor leaf = p.gate_up.clone().requires_grad_(true);
  const std::vector<at::Tensor> halves = leaf.split(kWidth, -1);
  const at::Tensor output = activation(halves[0], halves[1]);
  output.backward(p.grad);
  return {output.detach(), leaf.grad()};
}

TEST(SwiGluTest, IsHfsBitsForwardAndBackward) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const Problem p(dtype);
    const Result ours = ForwardAndBackward(p, SwiGlu);
    const Result hf = ForwardAndBackward(p, HfSwiGlu);
    EXPECT_TRUE(at::equal(ours.output, hf.output));
    EXPECT_TRUE(at::equal(ours.grad, hf.grad));
  }
}

// A frozen up (or gate) gets no gradient, and the other input its own.
TEST(SwiGluTest, GivesEachInputItsGradientAlone) {
  const Problem p(at::kFloat);
  const std::vector<at::Tensor> halves = p.gate_up.split(kWidth, -1);
  const at::Tensor gate = halves[0].clone().requires_grad_(true);
  const at::Tensor up = halves[1].clone();
  SwiGlu(gate, up).backward(p.grad);
  const at::Tensor reference_gate = halves[0].clone().requires_grad_(true);
  HfSwiGlu(reference_gate, up).backward(p.grad);
  EXPECT_TRUE(at::equal(gate.grad(), reference_gate.grad()));
  EXPECT_FALSE(up.grad().defined());
}

// Between forward and backward, HF's form holds silu(gate) beside its output; SwiGlu the
// output alone (gate and up are the caller's either way).
TEST(SwiGluTest, KeepsNoSiluForBackward) {
  base::TrackTensorMemory(at::kCPU);
  const Problem p(at::kBFloat16);
  const at::Tensor gate_up = p.gate_up.clone().requires_grad_(true);
  const std::vector<at::Tensor> halves = gate_up.split(kWidth, -1);
  const int64_t output_bytes = 3 * 7 * kWidth * 2;
  for (const bool ours : {true, false}) {
    SCOPED_TRACE(ours ? "SwiGlu" : "HfSwiGlu");
    const int64_t before = base::TensorMemory(at::kCPU);
    at::Tensor output = ours ? SwiGlu(halves[0], halves[1]) : HfSwiGlu(halves[0], halves[1]);
    const int64_t held = base::TensorMemory(at::kCPU) - before;
    EXPECT_EQ(held, ours ? output_bytes : 2 * output_bytes);
  }
}

}  // namespace
}  // namespace keel::models
