// The one place where Keel's code differs between LibTorch 1.13 (Debian) and 2.x (PyTorch
// wheels): c10d process-group construction, fused and multi-tensor kernels that 1.13 lacks, and
// what only a CUDA LibTorch has (NCCL groups, the current device, the caching allocator). In 1.13
// ProcessGroupGloo is a ProcessGroup; in 2.x it is a Backend that a ProcessGroup wraps. Keel APIs
// take `c10d::ProcessGroup&`, whose collectives have the same signatures in both. Under 2.x the
// first group Keel creates turns c10d's flight recorder off (TORCH_FR_BUFFER_SIZE=0) unless
// TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is set: it crashes when two threads
// start collectives on new groups at once (see torch_compat.cc).
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
//   c10::intrusive_ptr<c10d::ProcessGroup> group =
//       keel::base::CreateGlooProcessGroup(store, rank, world_size, std::chrono::seconds(60));
#ifndef KEEL_BASE_TORCH_COMPAT_H_
#define KEEL_BASE_TORCH_COMPAT_H_

#include <chrono>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"
#include "torch/csrc/distributed/c10d/Store.hpp"
#include "torch/optim/optimizer.h"

namespace keel::base {

// A Gloo process group of `size` ranks rendezvousing through `store`, using the network
// interface that `hostname` resolves to. Collective: a rendezvous of all `size` ranks.
// Throws c10::Error when the rendezvous fails (callers convert with CallTorch).
c10::intrusive_ptr<c10d::ProcessGroup> CreateGlooProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname = "127.0.0.1");

// Whether CreateNcclProcessGroup can succeed: a CUDA LibTorch with NCCL (KEEL_LIBTORCH) built
// with --config=cuda. Says nothing about GPUs being present (torch::cuda::device_count()).
bool HasNccl();

// An NCCL process group of `size` ranks rendezvousing through `store`, for CUDA tensors on each
// rank's current device (SetCudaDevice first). Collective: a rendezvous of all `size` ranks.
// Throws c10::Error when !HasNccl() or the rendezvous fails (callers convert with CallTorch).
c10::intrusive_ptr<c10d::ProcessGroup> CreateNcclProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// Makes CUDA device `index` this thread's current device. Throws c10::Error without a CUDA
// LibTorch or for a device that does not exist.
void SetCudaDevice(int index);

// The rendezvous store of a torchrun-style launch: rank 0 serves it at host:port, the others
// connect; construction waits up to `timeout` for all `world_size` ranks.
// Throws c10::Error when the store cannot be reached (callers convert with CallTorch).
c10::intrusive_ptr<c10d::Store> CreateTcpStore(const std::string& host, int port, bool is_server,
                                               int world_size, std::chrono::milliseconds timeout);

// The key of a parameter's state in torch::optim::Optimizer::state(): the address of its
// TensorImpl, printed (1.13) or as a void* (2.2 and later).
using OptimizerStateKey =
    std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey OptimizerStateKeyOf(const at::Tensor& param);

// tensors[i] *= scalar (a 0-d tensor on their device) without a host synchronization: one
// multi-tensor kernel where LibTorch has the Tensor overload of _foreach_mul_ (2.x), one
// mul_ per tensor otherwise (1.13).
void ForeachMulInPlace(at::TensorList tensors, const at::Tensor& scalar);

// Whether FusedAdamWStep runs: LibTorch 2.x has ATen's _fused_adamw_ (CPU and CUDA); 1.13 not.
bool HasFusedAdamW();

// Whether ProcessGroupGloo reduces and moves bf16 tensors: LibTorch 2.x; 1.13's refuses them
// ("Invalid scalar type").
bool GlooCarriesBFloat16();

// One AdamW step over tensors of one device and dtype in a single multi-tensor kernel (ATen's
// _fused_adamw_, what torch.optim.AdamW(fused=True) runs): each params[i] takes its
// decoupled weight decay and Adam update from grads[i], exp_avgs[i] and exp_avg_sqs[i]
// (max_exp_avg_sqs[i] with amsgrad, else the list is empty), with the bias corrections of the
// step count in steps[i], a 0-d float32 tensor on their device that the caller has already
// incremented. Throws c10::Error without HasFusedAdamW() or for tensors the kernel refuses.
void FusedAdamWStep(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList steps, double lr, double beta1, double beta2,
                    double weight_decay, double eps, bool amsgrad);

// Lets float32 matrix products on CUDA run on TF32 tensor cores (torch.backends.cuda.matmul's
// fp32_precision = "tf32"; allow_tf32 before 2.11), or back to full float32 ("ieee"): a
// process-wide setting of LibTorch's, read by every later product. bf16 products are not
// affected.
void SetCudaMatmulTf32(bool enabled);

// LibTorch's profiler (Kineto), for this process's operators and, with `cuda`, the kernels they
// launch on GPUs: StartProfiler, the work, StopProfiler. HasProfiler: LibTorch 2.x (1.13's event
// API differs; Keel profiles on 2.x only).
bool HasProfiler();
// Throws c10::Error without HasProfiler() or when a profiler is already on.
void StartProfiler(bool cuda);
// One operator call or kernel: its name, whether it ran on a device (a kernel, a device copy or
// set), and how long it took.
struct ProfiledEvent {
  std::string name;
  bool on_device = false;
  uint64_t duration_ns = 0;
};
// Stops the profiler, writes its Chrome trace to `trace_path` (chrome://tracing, Perfetto)
// unless it is empty, and returns the events. Throws c10::Error when none is on.
std::vector<ProfiledEvent> StopProfiler(const std::string& trace_path);

// Causal self-attention of q, k, v [batch, heads, seq, head_dim]: softmax(q k^T / sqrt(head_dim))
// v, each position attending to itself and the positions before it; [batch, heads, seq,
// head_dim]. On LibTorch 2.x one at::scaled_dot_product_attention, which picks a fused kernel
// (on GPUs flash or cuDNN for bf16/fp16, memory-efficient for fp32; the CPU's flash kernel)
// and never holds the [batch, heads, seq, seq] scores; on 1.13 CausalAttentionExplicit.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The same through explicit scores, a -inf mask above the diagonal and a softmax: what 1.13
// computes, and the reference that the fused kernels are tested and benchmarked against.
at::Tensor CausalAttentionExplicit(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Causal attention within a sliding window (Mistral's): position i attends to positions j with
// i - window < j <= i. CausalAttention when window >= seq. On LibTorch 2.x
// at::scaled_dot_product_attention with the window's boolean mask, on 1.13 explicit scores.
// Requires: window > 0.
at::Tensor SlidingWindowAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t window);

// Marks the work queued so far on the current CUDA stream of `device` (an event recorded on
// it); the returned function blocks the thread that calls it, any thread, until that work has
// run. For non_blocking device-to-host copies that another thread reads afterwards.
// Throws c10::Error without a CUDA LibTorch.
std::function<void()> RecordCudaFence(const at::Device& device);

// Releases the CUDA caching allocator's unused blocks (torch.cuda.empty_cache()); nothing to
// do with a LibTorch built without CUDA.
void ReleaseCachedCudaMemory();

}  // namespace keel::base

#endif  // KEEL_BASE_TORCH_COMPAT_H_
