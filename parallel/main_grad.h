// Megatron's gradient_accumulation_fusion: a weight whose gradient sync keeps a main gradient
// (gradients/dp_sync.h's main_grad_dtype, float32 for bf16 weights) may get its gradient
// added there by the layer's own backward, straight from the weight-gradient product, instead
// of a .grad in the weight's dtype that the sync adds afterwards: one pass and one
// weight-sized tensor less. A sync offers a weight's main gradient as a post-hook of the
// weight's gradient accumulator (torch::autograd::FunctionPostHook) that is also a MainGrad;
// a layer that takes it returns no gradient for the weight, and the sync's hook, which runs
// after the accumulator all the same, counts the weight's gradient as arrived.
//
//   if (MainGrad* main = MainGradOf(weight)) {
//     main->AddWeightGradient(grad_output_2d, input_2d);  // and return no weight gradient
//   }
#ifndef KEEL_PARALLEL_MAIN_GRAD_H_
#define KEEL_PARALLEL_MAIN_GRAD_H_

#include "ATen/core/Tensor.h"

namespace keel::parallel {

class MainGrad {
 public:
  // Adds grad_output^T input, the gradient of W in at::linear(input, W), to W's main gradient:
  // grad_output [tokens, W's rows], input [tokens, W's columns], both in W's dtype. Call it
  // from W's backward, once per product (a chunked product calls it once per chunk). May throw
  // c10::Error; the sync reports its own errors (a gradient after its bucket was reduced) at
  // its Wait().
  virtual void AddWeightGradient(const at::Tensor& grad_output, const at::Tensor& input) = 0;

 protected:
  ~MainGrad() = default;
};

// The main gradient a sync offers for `weight`, or null: for a tensor that is not a leaf
// requiring grad, or whose sync keeps no main gradients or does not fuse. Owned by the sync;
// valid while it lives.
MainGrad* MainGradOf(const at::Tensor& weight);

// grad_output^T input added to `rows` (overwrite: written into it), a contiguous
// [grad_output.size(1), input.size(1)] tensor: a main gradient's rows. On a GPU, bf16 or fp16
// inputs into float32 rows take one GEMM that accumulates in float32 and writes the rows
// (at::mm / at::addmm with out_dtype). Elsewhere the product is taken in the inputs' dtype and
// then added, the arithmetic of autograd's gradient followed by the sync's addition.
void AddProductInto(at::Tensor& rows, const at::Tensor& grad_output, const at::Tensor& input,
                    bool overwrite);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_MAIN_GRAD_H_
