// The experts of a mixture-of-experts layer and the trip of the tokens to them and back, after
// Megatron-Core's transformer/moe/experts.py (GroupedMLP) and token_dispatcher.py
// (MoEAlltoAllTokenDispatcher, dropless): the experts are split over the expert-parallel
// group by index, each token's hidden state goes to the ranks of its k experts with an
// all-to-all, and the experts' outputs come back the same way, weighted by the routing
// probabilities and summed per token. With Megatron's sequence parallelism the layer takes the
// whole sequence (the caller gathers it) and gives back this rank's share.
//
//   keel::parallel::SequentialMlp experts(num_experts, hidden, ffn, ep);  // this rank's experts
//   at::Tensor parts = keel::parallel::DispatchToExperts(tokens, routing, *experts, ep);
//   at::Tensor out = keel::parallel::SumExpertParts(parts.view_as(x), *experts, nullptr);
#ifndef KEEL_PARALLEL_MOE_TOKEN_DISPATCHER_H_
#define KEEL_PARALLEL_MOE_TOKEN_DISPATCHER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "parallel/layout.h"
#include "parallel/moe/router.h"
#include "parallel/tensor_parallel/layers.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

// The layout dimension SequentialMlp shards its experts over: what marks a parameter as an
// expert's (gradients::HasLayoutDim) for the optimizer and the gradient scaling.
inline constexpr char kExpertDim[] = "ep";

// This rank's num_experts / ep experts (experts [rank x that, ...)), run one after another
// (Megatron-Core's SequentialMLP, not its grouped-GEMM GroupedMLP), each an MLP
// x -> gelu(x fc1_e) fc2_e without biases, their weights stacked: fc1 [local, hidden, ffn],
// fc2 [local, ffn, hidden], laid out as blocks of the whole [num_experts, ...] tensors
// sharded over kExpertDim. Over `expert_tp` (Megatron's expert tensor-parallel group) each expert
// is split as a column- then row-parallel MLP: this rank holds ffn / its size of the ffn columns
// (dimension "expert_tp"), and the ranks of the group, which hold the same tokens, sum their
// partial outputs. The weights start at zeros (a model copies its weights in). Throws
// c10::Error naming the numbers unless num_experts is a positive multiple of ep's size and
// ffn_hidden_size one of expert_tp's. Requires: `ep` and `expert_tp` (nullptr: one rank)
// outlive the module.
class SequentialMlpImpl : public torch::nn::Module, public LaidOut {
 public:
  SequentialMlpImpl(int64_t num_experts, int64_t hidden_size, int64_t ffn_hidden_size,
                    c10d::ProcessGroup* ep, c10d::ProcessGroup* expert_tp = nullptr);

  // The outputs of `tokens` ([n, hidden]) in groups of `counts` rows (they sum to n), group c
  // through local expert c % num_local_experts(), the groups one after another: [n, hidden].
  // Over expert_tp, this rank's part, which the ranks' parts add up to (DispatchToExperts sums
  // them). An expert whose groups are empty still runs: its weights get zero gradients. Each
  // stacked weight is read once a call, so that backward builds its gradient once (a stack of
  // the experts' gradients), not once per group. Throws c10::Error unless the counts sum to n.
  at::Tensor forward(const at::Tensor& tokens, const std::vector<int64_t>& counts);

  int64_t num_experts() const { return num_experts_; }
  int64_t num_local_experts() const { return fc1_.size(0); }
  c10d::ProcessGroup* expert_tp() const { return expert_tp_; }
  std::map<std::string, TensorLayout> LocalLayouts() const override;

 private:
  int64_t num_experts_;
  c10d::ProcessGroup* ep_;
  c10d::ProcessGroup* expert_tp_;
  at::Tensor fc1_;
  at::Tensor fc2_;
};

TORCH_MODULE(SequentialMlp);

// Each token of `tokens` ([T, hidden]) through its experts (`routing`, over all of the
// layer's experts), the outputs summed with the routing probabilities as weights: [T, hidden],
// this rank's part over the experts' expert_tp (SumExpertParts adds the parts up; without
// expert_tp, the output itself). Over `ep` the tokens of each rank travel to the ranks of their
// experts and back (two all-to-alls each way with their counts); a rank whose experts receive no
// tokens runs the same collectives. Over expert_tp, whose ranks hold the same tokens and
// routing, one all-reduce sums the parts of the tokens' gradients and one those of the
// probabilities' (backward). Differentiable (the backward pass runs the all-to-alls in reverse).
// The counts are read to the host once a call (the one wait for the device: the token exchange
// and the experts' slices need their sizes). The all-to-alls (the counts and the tokens, both
// ways, forward and backward) count as CommKind::kExpertDispatch (comm_timers.h).
// Collective: over `ep` and expert_tp, forward and backward; nothing on one rank. Throws c10::Error
// when a collective fails, as LibTorch does (callers wrap forward and backward in base::CallTorch).
at::Tensor DispatchToExperts(const at::Tensor& tokens, const Routing& routing,
                             SequentialMlpImpl& experts, c10d::ProcessGroup* ep);

// The layer's output from DispatchToExperts' parts (viewed as [batch, seq, hidden]), summed over
// the experts' expert_tp: whole (`sequence_group` nullptr), or with Megatron's sequence
// parallelism over `sequence_group` (the tensor-parallel group; the tokens were the whole
// sequence, gathered) this rank's share of the sequence. Where expert_tp is that group, one
// reduce-scatter does both, as after a row-parallel layer; otherwise an all-reduce over
// expert_tp (none on one rank) and this rank's chunk. Differentiable: backward hands every rank
// the whole gradient. Requires: expert_tp's groups lie within `sequence_group`'s (the mesh's
// order); its size divides the sequence.
at::Tensor SumExpertParts(const at::Tensor& parts, const SequentialMlpImpl& experts,
                          c10d::ProcessGroup* sequence_group);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_MOE_TOKEN_DISPATCHER_H_
