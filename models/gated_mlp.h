// The gated MLP of Llama-style models (SwiGLU) under Hugging Face's names:
// down_proj(silu(gate_proj(x)) * up_proj(x)), gate_proj and up_proj column-parallel (two
// weights, not one fused [gate; up], so that each is one block per rank under its HF name, but
// one matrix product of the two stacked: Megatron's linear_fc1), down_proj row-parallel; no
// biases. With sequence parallelism x and the output are this rank's share of the sequence.
// The activation is SwiGlu, which keeps no silu(gate) for backward.
//
//   GatedMlp mlp(hidden_size, intermediate_size, tp);
//   at::Tensor y = mlp->forward(x);  // x and y [..., hidden], whole on every rank
#ifndef KEEL_MODELS_GATED_MLP_H_
#define KEEL_MODELS_GATED_MLP_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::models {

// silu(gate) * up, differentiable in both, keeping only gate and up for backward: backward makes
// silu(gate) again rather than keeping it (Megatron's SwiGLUFunction, which keeps its input).
// Outputs and gradients are the bits of ATen's autograd of silu(gate) * up (Hugging Face's
// act_fn(gate_proj(x)) * up_proj(x)), which keeps one more tensor of gate's shape.
// Requires: gate and up of one shape, dtype and device.
at::Tensor SwiGlu(const at::Tensor& gate, const at::Tensor& up);

class GatedMlpImpl : public torch::nn::Module {
 public:
  // Requires: tp's size divides intermediate_size.
  GatedMlpImpl(int64_t hidden_size, int64_t intermediate_size, c10d::ProcessGroup* tp,
               bool sequence_parallel = false);
  at::Tensor forward(const at::Tensor& x);

 private:
  parallel::ColumnParallelLinear gate_proj_{nullptr}, up_proj_{nullptr};
  parallel::RowParallelLinear down_proj_{nullptr};
};
TORCH_MODULE(GatedMlp);

}  // namespace keel::models

#endif  // KEEL_MODELS_GATED_MLP_H_
