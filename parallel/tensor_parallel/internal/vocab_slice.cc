#include "parallel/tensor_parallel/internal/vocab_slice.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>

#include "ATen/ATen.h"

#ifdef KEEL_CUDA_KERNELS
#include "ATen/cuda/CUDAContext.h"
#include "c10/cuda/CUDAGuard.h"
#include "parallel/tensor_parallel/internal/cross_entropy_cuda.h"
#endif

namespace keel::parallel::internal {
namespace {

// The target's column in the slice (0 where the slice does not hold it), and where it does not.
struct LocalTarget {
  at::Tensor column;
  at::Tensor outside;
};

LocalTarget Local(const at::Tensor& target, const VocabSlice& slice) {
  const at::Tensor column = target - slice.begin;
  const at::Tensor outside = column.lt(0).logical_or(column.ge(slice.real));
  return {column.masked_fill(outside, 0), outside};
}

#ifdef KEEL_CUDA_KERNELS
void* StreamOf(const at::Tensor& tensor) {
  return at::cuda::getCurrentCUDAStream(tensor.device().index()).stream();
}

// LogNormaliser in Keel's kernel: the logits read once, about 2 bytes of memory traffic a
// logit where ATen's float32 passes take about 18.
SliceLogNormaliser KernelLogNormaliser(const at::Tensor& logits, const at::Tensor& target,
                                       const VocabSlice& slice) {
  const at::Tensor rows = logits.contiguous();
  const at::Tensor targets = target.contiguous();
  const c10::cuda::CUDAGuard on_its_device(rows.device());
  const at::TensorOptions floats = rows.options().dtype(at::kFloat);
  SliceLogNormaliser out{at::empty({rows.size(0)}, floats), at::empty({rows.size(0)}, floats)};
  if (rows.size(0) == 0) return out;
  const char* error = LaunchSliceLogNormaliser(
      rows.data_ptr(), targets.data_ptr<int64_t>(), rows.size(0), rows.size(1), slice.begin,
      slice.real, out.lse.data_ptr<float>(), out.target_logit.data_ptr<float>(), StreamOf(rows));
  TORCH_CHECK(error == nullptr, "Keel's cross-entropy kernel (log-normaliser): ", error);
  return out;
}

// SoftmaxMinusTarget in Keel's kernel: the logits read once and the gradient written in the same
// pass, 4 bytes a logit.
at::Tensor KernelGradient(const at::Tensor& logits, const at::Tensor& target,
                          const VocabSlice& slice, const at::Tensor& lse,
                          const at::Tensor& grad_loss) {
  const at::Tensor rows = logits.contiguous();
  const at::Tensor targets = target.contiguous();
  const at::Tensor normalisers = lse.contiguous();
  const at::Tensor scales = grad_loss.to(at::kFloat).contiguous();
  const c10::cuda::CUDAGuard on_its_device(rows.device());
  at::Tensor grad = at::empty(rows.sizes(), rows.options());
  if (rows.size(0) == 0) return grad;
  const char* error = LaunchSliceGradient(
      rows.data_ptr(), targets.data_ptr<int64_t>(), normalisers.data_ptr<float>(),
      scales.data_ptr<float>(), rows.size(0), rows.size(1), slice.begin, slice.real,
      grad.data_ptr(), StreamOf(rows));
  TORCH_CHECK(error == nullptr, "Keel's cross-entropy kernel (gradient): ", error);
  return grad;
}
#endif

}  // namespace

bool TakesKernels(const at::Tensor& logits) {
#ifdef KEEL_CUDA_KERNELS
  return logits.is_cuda() && logits.scalar_type() == at::kBFloat16;
#else
  (void)logits;
  return false;
#endif
}

at::Tensor MaskPadding(const at::Tensor& logits, int64_t real) {
  const int64_t columns = logits.size(-1);
  if (real >= columns) return logits;
  const at::Tensor padding =
      at::arange(columns, logits.options().dtype(at::kLong)).ge(std::max<int64_t>(0, real));
  return logits.masked_fill(padding, -std::numeric_limits<float>::infinity());
}

SliceLogNormaliser LogNormaliser(const at::Tensor& logits, const at::Tensor& target,
                                 const VocabSlice& slice) {
#ifdef KEEL_CUDA_KERNELS
  if (TakesKernels(logits)) return KernelLogNormaliser(logits, target, slice);
#endif
  const at::Tensor x = MaskPadding(logits.to(at::kFloat), slice.real);
  const at::Tensor max = std::get<0>(x.max(-1));
  // A row without a real logit has no finite maximum to shift by: its sum is 0, log 0 = -inf.
  const at::Tensor shift = max.masked_fill(max.isneginf(), 0);
  const LocalTarget local = Local(target, slice);
  return {(x - shift.unsqueeze(-1)).exp_().sum(-1).log_().add_(shift),
          x.gather(-1, local.column.unsqueeze(-1)).squeeze(-1).masked_fill(local.outside, 0)};
}

at::Tensor SoftmaxMinusTarget(const at::Tensor& logits, const at::Tensor& target,
                              const VocabSlice& slice, const at::Tensor& lse,
                              const at::Tensor& grad_loss) {
#ifdef KEEL_CUDA_KERNELS
  if (TakesKernels(logits)) return KernelGradient(logits, target, slice, lse, grad_loss);
#endif
  // Out of place first: float32 logits are the caller's own tensor.
  at::Tensor grad =
      at::sub(MaskPadding(logits.to(at::kFloat), slice.real), lse.unsqueeze(-1)).exp_();
  const LocalTarget local = Local(target, slice);
  grad.scatter_add_(-1, local.column.unsqueeze(-1),
                    local.outside.logical_not().to(at::kFloat).neg().unsqueeze(-1));
  grad.mul_(grad_loss.to(at::kFloat).unsqueeze(-1));
  return grad.to(logits.scalar_type());
}

}  // namespace keel::parallel::internal
