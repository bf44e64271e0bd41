// RMSNorm as Hugging Face's Llama computes it: x / sqrt(mean(x^2) + eps) in float32, cast back
// to x's dtype, then times the weight ("weight", ones at first). The weight is whole on every
// rank: it normalises the whole hidden size, or each head's dimensions (Qwen3's q/k norms), where
// each tensor-parallel rank holds only its heads and so computes part of the weight's gradient:
// that part is summed over the group in the backward pass (Megatron's copy-to-tensor-parallel-
// region on the weight), so that every rank holds the whole gradient.
//
//   RmsNorm norm(hidden_size, 1e-5);
//   RmsNorm per_head(head_dim, 1e-5, tp);  // each rank sees its heads only
//   at::Tensor y = norm->forward(x);  // over x's last dimension
#ifndef KEEL_MODELS_RMS_NORM_H_
#define KEEL_MODELS_RMS_NORM_H_

#include <cstdint>

#include "ATen/core/Tensor.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::models {

class RmsNormImpl : public torch::nn::Module {
 public:
  // `partial_over`: the group over which each rank sees part of what is normalised (nullptr:
  // every rank sees all of it). The group outlives the module.
  RmsNormImpl(int64_t size, double eps, c10d::ProcessGroup* partial_over = nullptr);
  at::Tensor forward(const at::Tensor& x);

 private:
  double eps_;
  c10d::ProcessGroup* partial_over_;
  at::Tensor weight_;
};
TORCH_MODULE(RmsNorm);

}  // namespace keel::models

#endif  // KEEL_MODELS_RMS_NORM_H_
