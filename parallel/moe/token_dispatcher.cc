#include "parallel/moe/token_dispatcher.h"

#include <atomic>
#include <chrono>
#include <tuple>
#include <vector>

#include "ATen/ATen.h"
#include "base/collectives.h"
#include "c10/util/Exception.h"
#include "parallel/comm_timers.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/autograd/custom_function.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

// `input`'s rows split by `send` (rows for each rank, in rank order) to the ranks of `group`;
// returns the rows each rank sent here, `receive` of them from each, in rank order.
at::Tensor AllToAllRows(const at::Tensor& input, std::vector<int64_t> send,
                        std::vector<int64_t> receive, c10d::ProcessGroup& group) {
  int64_t rows = 0;
  for (const int64_t n : receive) rows += n;
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = rows;
  at::Tensor output = at::empty(shape, input.options());
  at::Tensor contiguous = input.contiguous();
  CommTimers::Time(CommKind::kExpertDispatch,
                   [&] { group.alltoall_base(output, contiguous, receive, send)->wait(); });
  return output;
}

// AllToAllRows as an autograd function: the backward pass sends the gradients back the way
// the rows came.
class AllToAll : public torch::autograd::Function<AllToAll> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            std::vector<int64_t> send, std::vector<int64_t> receive,
                            c10d::ProcessGroup* group) {
    ctx->saved_data["send"] = send;
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return AllToAllRows(input, std::move(send), std::move(receive), *group);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
    return {AllToAllRows(grads[0], ctx->saved_data["receive"].toIntVector(),
                         ctx->saved_data["send"].toIntVector(), *group),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The counts a layer exchanges, read to the host at once (one wait for the device a layer):
// this rank's [ranks, local experts] counts sent and received, and their rows' sums.
struct HostCounts {
  std::vector<int64_t> received;  // flat, [source rank][local expert]
  std::vector<int64_t> send_rows;
  std::vector<int64_t> receive_rows;
};

HostCounts ReadCounts(const at::Tensor& counts, const at::Tensor& received_counts) {
  const at::Tensor host = at::stack({counts, received_counts}).to(at::kCPU, at::kLong);
  const auto values = [](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  };
  return {values(host[1]), values(host[0].sum(1)), values(host[1].sum(1))};
}

}  // namespace

SequentialMlpImpl::SequentialMlpImpl(int64_t num_experts, int64_t hidden_size,
                                     int64_t ffn_hidden_size, c10d::ProcessGroup* ep,
                                     c10d::ProcessGroup* expert_tp)
    : num_experts_(num_experts), ep_(ep), expert_tp_(expert_tp) {
  TORCH_CHECK(num_experts > 0 && num_experts % base::GroupSize(ep) == 0, "num_experts (",
              num_experts, ") must be a positive multiple of the expert-parallel size (",
              base::GroupSize(ep), ")");
  TORCH_CHECK(ffn_hidden_size > 0 && ffn_hidden_size % base::GroupSize(expert_tp) == 0,
              "ffn_hidden_size (", ffn_hidden_size,
              ") must be a positive multiple of the expert tensor-parallel size (",
              base::GroupSize(expert_tp), ")");
  const int64_t local = num_experts / base::GroupSize(ep);
  const int64_t ffn = ffn_hidden_size / base::GroupSize(expert_tp);
  fc1_ = register_parameter("fc1", NewParameter({local, hidden_size, ffn}));
  fc2_ = register_parameter("fc2", NewParameter({local, ffn, hidden_size}));
}

at::Tensor SequentialMlpImpl::forward(const at::Tensor& tokens,
                                      const std::vector<int64_t>& counts) {
  int64_t rows = 0;
  for (const int64_t n : counts) rows += n;
  TORCH_CHECK(rows == tokens.size(0), "the experts' groups of rows (", rows,
              " in all) must cover the ", tokens.size(0), " tokens");
  // Unbound once: indexing the stacked weights per group would make backward build a whole
  // zero-filled [local, ...] gradient for every group and add them all up.
  const std::vector<at::Tensor> fc1 = fc1_.unbind(0);
  const std::vector<at::Tensor> fc2 = fc2_.unbind(0);
  const int64_t local = num_local_experts();
  std::vector<at::Tensor> outputs;
  int64_t start = 0;
  for (size_t c = 0; c < counts.size(); ++c) {
    const int64_t e = static_cast<int64_t>(c) % local;
    outputs.push_back(
        at::matmul(at::gelu(at::matmul(tokens.narrow(0, start, counts[c]), fc1[e])), fc2[e]));
    start += counts[c];
  }
  return at::cat(outputs);
}

std::map<std::string, TensorLayout> SequentialMlpImpl::LocalLayouts() const {
  std::map<std::string, TensorLayout> layouts;
  // fc1's columns and fc2's rows are the ffn dimension split over expert_tp.
  for (const auto& [name, local, ffn_dim] : {std::tuple{"fc1", fc1_, 2}, {"fc2", fc2_, 1}}) {
    std::vector<int64_t> shape = local.sizes().vec();
    shape[0] = num_experts_;
    shape[ffn_dim] *= base::GroupSize(expert_tp_);
    std::vector<LayoutDim> dims;
    if (base::GroupSize(ep_) > 1) dims.push_back({kExpertDim, ep_, Placement::Shard(0)});
    if (base::GroupSize(expert_tp_) > 1)
      dims.push_back({"expert_tp", expert_tp_, Placement::Shard(ffn_dim)});
    if (dims.empty()) return {};
    absl::StatusOr<TensorLayout> layout = EvenlySharded(shape, std::move(dims));
    TORCH_INTERNAL_ASSERT(layout.ok(), layout.status().ToString());
    layouts[name] = *std::move(layout);
  }
  return layouts;
}

at::Tensor DispatchToExperts(const at::Tensor& tokens, const Routing& routing,
                             SequentialMlpImpl& experts, c10d::ProcessGroup* ep) {
  base::CheckGroupCarriesOrThrow(ep, tokens.device(), "the experts' token all-to-all");
  const int64_t k = routing.indices.size(1);
  const int64_t ranks = base::GroupSize(ep);
  const int64_t local = experts.num_local_experts();
  // Permute: every (token, expert) pair, ordered by expert (stable: by token within one).
  const at::Tensor expert_of = routing.indices.reshape({-1});
  const at::Tensor order = std::get<1>(at::sort(expert_of, /*stable=*/true, 0, false));
  const at::Tensor token_of =
      at::arange(tokens.size(0), expert_of.options()).repeat_interleave(k).index_select(0, order);
  const at::Tensor permuted = tokens.index_select(0, token_of);
  const at::Tensor per_expert = at::bincount(expert_of, {}, experts.num_experts());
  // Counts first: what each rank receives from every rank for each of its local experts.
  at::Tensor counts = per_expert.view({ranks, local}).contiguous();
  at::Tensor received_counts = counts;
  if (ranks > 1) {
    received_counts = at::empty_like(counts);
    std::vector<int64_t> send(ranks, 1);  // one row of counts for each rank
    std::vector<int64_t> receive(ranks, 1);
    CommTimers::Time(CommKind::kExpertDispatch,
                     [&] { ep->alltoall_base(received_counts, counts, receive, send)->wait(); });
  }
  const HostCounts host = ReadCounts(counts, received_counts);
  at::Tensor received = permuted;
  if (ranks > 1) received = AllToAll::apply(permuted, host.send_rows, host.receive_rows, ep);
  // The tokens from every rank, grouped [source rank][local expert], one source rank's tokens
  // at a time: an expert's gradient is then the sum of each rank's part, as where each rank's
  // tokens are a micro-batch of one rank (float sums in the same order), rather than one
  // product over all of them. Over expert_tp every rank holds the same tokens and its part of
  // each expert: the outputs stay parts until SumExpertParts (a token's, not each of its k
  // pairs'), and backward sums the parts of the tokens' gradients here, and of the
  // probabilities' (each part weighs its own part of the output) below.
  c10d::ProcessGroup* expert_tp = experts.expert_tp();
  at::Tensor expert_out =
      experts.forward(CopyToTensorParallelRegion(received, expert_tp), host.received);
  if (ranks > 1) expert_out = AllToAll::apply(expert_out, host.receive_rows, host.send_rows, ep);
  // Unpermute: each pair's output weighted by its probability, summed per token.
  const at::Tensor weights = CopyToTensorParallelRegion(routing.probs, expert_tp)
                                 .reshape({-1})
                                 .index_select(0, order)
                                 .unsqueeze(1);
  return at::zeros_like(tokens).index_add(0, token_of, expert_out * weights.to(expert_out.dtype()));
}

at::Tensor SumExpertParts(const at::Tensor& parts, const SequentialMlpImpl& experts,
                          c10d::ProcessGroup* sequence_group) {
  c10d::ProcessGroup* expert_tp = experts.expert_tp();
  if (sequence_group == nullptr) return ReduceFromTensorParallelRegion(parts, expert_tp);
  if (base::GroupSize(expert_tp) == base::GroupSize(sequence_group)) {
    return ReduceScatterToSequenceParallelRegion(parts, sequence_group);
  }
  return ScatterToSequenceParallelRegion(ReduceFromTensorParallelRegion(parts, expert_tp),
                                         sequence_group);
}

}  // namespace keel::parallel
