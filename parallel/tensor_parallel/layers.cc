#include "parallel/tensor_parallel/layers.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/attention.h"
#include "base/collectives.h"
#include "parallel/parameters.h"
#include "parallel/recompute.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

bool Parallel(c10d::ProcessGroup* tp) { return base::GroupSize(tp) > 1; }

}  // namespace

TensorLayout ShardedOverTp(c10d::ProcessGroup* tp, std::vector<int64_t> global_shape, int64_t dim) {
  // The dimension exists: EvenlySharded cannot fail here.
  return *EvenlySharded(std::move(global_shape), {{kTensorDim, tp, Placement::Shard(dim)}});
}

namespace {

// Calls `visit` with `module` and each of its submodules, and the prefix of their parameters'
// fully qualified names ("" and "<name>.").
void ForEachModule(const torch::nn::Module& module,
                   const std::function<void(const torch::nn::Module&, const std::string&)>& visit) {
  // Not named_modules(include_self = true): that needs the module in a shared_ptr, which a
  // module's constructor does not have yet.
  visit(module, "");
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    visit(*item.value(), item.key() + ".");
  }
}

}  // namespace

std::map<std::string, TensorLayout> ParameterLayouts(const torch::nn::Module& module) {
  std::map<std::string, TensorLayout> layouts;
  ForEachModule(module, [&](const torch::nn::Module& part, const std::string& prefix) {
    const auto* laid_out = dynamic_cast<const LaidOut*>(&part);
    if (laid_out == nullptr) return;
    for (const auto& [name, layout] : laid_out->LocalLayouts()) layouts[prefix + name] = layout;
  });
  return layouts;
}

std::vector<std::string> SequenceParallelParameters(const torch::nn::Module& module) {
  std::set<std::string> names;
  ForEachModule(module, [&](const torch::nn::Module& part, const std::string& prefix) {
    const auto* split = dynamic_cast<const SequenceSplit*>(&part);
    if (split == nullptr) return;
    for (const std::string& name : split->LocalSequenceParallelParameters()) {
      names.insert(prefix + name);
    }
  });
  return {names.begin(), names.end()};
}

namespace {

// Copies into `target` (the parameter `name` of a model with `layouts`) its block of the whole
// model's `source`. Requires: a NoGradGuard.
absl::Status CopyBlock(const std::string& name, at::Tensor& target,
                       const std::map<std::string, TensorLayout>& layouts,
                       const at::Tensor& source) {
  auto it = layouts.find(name);
  const bool fits = it == layouts.end() ? source.sizes() == target.sizes()
                                        : source.sizes().vec() == it->second.global_shape;
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter '", name, "': the whole model's is [", absl::StrJoin(source.sizes(), ", "),
        "], this model's block is [", absl::StrJoin(target.sizes(), ", "), "]",
        it == layouts.end()
            ? ""
            : absl::StrCat(" of [", absl::StrJoin(it->second.global_shape, ", "), "]")));
  }
  target.copy_(it == layouts.end() ? source : BlockOf(source, it->second, target.sizes()));
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyFromWholeModel(torch::nn::Module& model, const torch::nn::Module& whole) {
  const std::map<std::string, TensorLayout> layouts = ParameterLayouts(model);
  const auto sources = whole.named_parameters(/*recurse=*/true);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor* source = sources.find(item.key());
    if (source == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the whole model has no parameter '", item.key(), "'"));
    }
    if (absl::Status copied = CopyBlock(item.key(), item.value(), layouts, *source); !copied.ok()) {
      return copied;
    }
  }
  return absl::OkStatus();
}

absl::Status InitialiseFromWholeSteps(torch::nn::Module& model,
                                      const std::vector<WholeInitStep>& steps) {
  const std::map<std::string, TensorLayout> layouts = ParameterLayouts(model);
  auto targets = model.named_parameters(/*recurse=*/true);
  // A model on the meta device (built only to describe itself) takes no values: nothing is
  // drawn, so describing a large model costs neither its draws' time nor memory.
  if (!targets.is_empty() && targets.front().value().is_meta()) return absl::OkStatus();
  at::NoGradGuard no_grad;
  for (const WholeInitStep& step : steps) {
    at::Tensor* target = targets.find(step.name);
    const at::TensorOptions options = at::TensorOptions().dtype(step.dtype);
    // Another stage's parameter is drawn all the same, so that the later draws line up.
    if (step.std <= 0 && target == nullptr) continue;
    const at::Tensor whole = step.std > 0 ? at::empty(step.shape, options).normal_(0.0, step.std)
                                          : at::zeros(step.shape, options);
    if (target == nullptr) continue;
    if (absl::Status copied = CopyBlock(step.name, *target, layouts, whole); !copied.ok()) {
      return copied;
    }
  }
  return absl::OkStatus();
}

namespace {

// ColumnParallelProduct over weights stacked by rows.
at::Tensor StackedProduct(const at::Tensor& input, const std::vector<at::Tensor>& weights,
                          const at::Tensor& bias, c10d::ProcessGroup* tp, bool sequence_parallel) {
  if (sequence_parallel) return LinearWithGradAccumulation(input, weights, bias, tp);
  return LinearWithGradAccumulation(CopyToTensorParallelRegion(input, tp), weights, bias, nullptr);
}

}  // namespace

at::Tensor ColumnParallelProduct(const at::Tensor& input, const at::Tensor& weight,
                                 const at::Tensor& bias, c10d::ProcessGroup* tp,
                                 bool sequence_parallel) {
  return StackedProduct(input, {weight}, bias, tp, sequence_parallel);
}

at::Tensor ColumnParallelInput(const at::Tensor& input, c10d::ProcessGroup* tp,
                               bool sequence_parallel) {
  return sequence_parallel ? GatherFromSequenceParallelRegion(input, tp)
                           : CopyToTensorParallelRegion(input, tp);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t input_size, int64_t output_size,
                                                   c10d::ProcessGroup* tp, bool bias,
                                                   bool gather_output, bool sequence_parallel)
    : input_size_(input_size),
      output_size_(output_size),
      tp_(tp),
      gather_output_(gather_output),
      sequence_parallel_(sequence_parallel && Parallel(tp)) {
  weight_ =
      register_parameter("weight", NewParameter({output_size / base::GroupSize(tp), input_size}));
  if (bias) bias_ = register_parameter("bias", NewParameter({output_size / base::GroupSize(tp)}));
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  const at::Tensor output =
      Adapted(ColumnParallelProduct(input, weight_, bias_, tp_, sequence_parallel_), input);
  return gather_output_ ? GatherFromTensorParallelRegion(output, tp_) : output;
}

at::Tensor ColumnParallelLinearImpl::Adapted(at::Tensor output, const at::Tensor& input) {
  return adapter_ ? output + adapter_->forward(input) : output;
}

std::vector<at::Tensor> ColumnParallelLinearImpl::ForwardStacked(
    const at::Tensor& input, const std::vector<ColumnParallelLinearImpl*>& layers) {
  TORCH_CHECK(!layers.empty(), "ForwardStacked needs at least one layer");
  const ColumnParallelLinearImpl& first = *layers.front();
  std::vector<at::Tensor> weights, biases;
  std::vector<int64_t> rows;
  for (const ColumnParallelLinearImpl* layer : layers) {
    TORCH_CHECK(layer->tp_ == first.tp_ && layer->sequence_parallel_ == first.sequence_parallel_ &&
                    layer->input_size_ == first.input_size_ && !layer->gather_output_ &&
                    layer->bias_.defined() == first.bias_.defined(),
                "ForwardStacked's layers must share tp, sequence parallelism, input size and "
                "having a bias, and gather no output");
    weights.push_back(layer->weight_);
    if (layer->bias_.defined()) biases.push_back(layer->bias_);
    rows.push_back(layer->weight_.size(0));
  }
  const at::Tensor bias = biases.empty()       ? at::Tensor()
                          : layers.size() == 1 ? biases[0]
                                               : at::cat(biases);
  std::vector<at::Tensor> outputs =
      StackedProduct(input, weights, bias, first.tp_, first.sequence_parallel_)
          .split_with_sizes(rows, -1);
  for (size_t i = 0; i < layers.size(); ++i) outputs[i] = layers[i]->Adapted(outputs[i], input);
  return outputs;
}

void ColumnParallelLinearImpl::Adapt(std::shared_ptr<LinearAdapter> adapter) {
  adapter_ = register_module("adapter", std::move(adapter));
}

std::map<std::string, TensorLayout> ColumnParallelLinearImpl::LocalLayouts() const {
  if (!Parallel(tp_)) return {};
  std::map<std::string, TensorLayout> layouts = {
      {"weight", ShardedOverTp(tp_, {output_size_, input_size_}, 0)}};
  if (bias_.defined()) layouts["bias"] = ShardedOverTp(tp_, {output_size_}, 0);
  return layouts;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t input_size, int64_t output_size,
                                             c10d::ProcessGroup* tp, bool bias,
                                             bool input_is_parallel, bool sequence_parallel)
    : input_size_(input_size),
      output_size_(output_size),
      tp_(tp),
      input_is_parallel_(input_is_parallel),
      sequence_parallel_(sequence_parallel && Parallel(tp)) {
  weight_ =
      register_parameter("weight", NewParameter({output_size, input_size / base::GroupSize(tp)}));
  if (bias) bias_ = register_parameter("bias", NewParameter({output_size}));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  // One rank: the ordinary layer's fused bias addition, to the bit.
  if (!Parallel(tp_)) {
    const at::Tensor output = LinearWithGradAccumulation(input, {weight_}, bias_, nullptr);
    return adapter_ ? output + adapter_->forward(input) : output;
  }
  const at::Tensor local = input_is_parallel_ ? input : ScatterToTensorParallelRegion(input, tp_);
  const at::Tensor partial = LinearWithGradAccumulation(local, {weight_}, at::Tensor(), nullptr);
  at::Tensor output = sequence_parallel_ ? ReduceScatterToSequenceParallelRegion(partial, tp_)
                                         : ReduceFromTensorParallelRegion(partial, tp_);
  if (adapter_) output = output + adapter_->forward(local);
  return bias_.defined() ? output + bias_ : output;
}

void RowParallelLinearImpl::Adapt(std::shared_ptr<LinearAdapter> adapter) {
  adapter_ = register_module("adapter", std::move(adapter));
}

std::map<std::string, TensorLayout> RowParallelLinearImpl::LocalLayouts() const {
  if (!Parallel(tp_)) return {};
  return {{"weight", ShardedOverTp(tp_, {output_size_, input_size_}, 1)}};
}

std::vector<std::string> RowParallelLinearImpl::LocalSequenceParallelParameters() const {
  if (!sequence_parallel_ || !bias_.defined()) return {};
  return {"bias"};
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t num_embeddings,
                                                       int64_t embedding_dim,
                                                       c10d::ProcessGroup* tp,
                                                       bool reduce_scatter_embeddings)
    : num_embeddings_(num_embeddings),
      embedding_dim_(embedding_dim),
      tp_(tp),
      reduce_scatter_embeddings_(reduce_scatter_embeddings) {
  weight_ = register_parameter("weight",
                               NewParameter({num_embeddings / base::GroupSize(tp), embedding_dim}));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& tokens) {
  if (!Parallel(tp_)) return at::embedding(weight_, tokens);
  const int64_t rows = weight_.size(0);
  const int64_t begin = tp_->getRank() * rows;
  const at::Tensor outside = tokens.lt(begin).logical_or(tokens.ge(begin + rows));
  const at::Tensor local = at::embedding(weight_, (tokens - begin).masked_fill(outside, 0))
                               .masked_fill(outside.unsqueeze(-1), 0);
  return reduce_scatter_embeddings_ ? ReduceScatterToSequenceParallelRegion(local, tp_)
                                    : ReduceFromTensorParallelRegion(local, tp_);
}

std::map<std::string, TensorLayout> VocabParallelEmbeddingImpl::LocalLayouts() const {
  if (!Parallel(tp_)) return {};
  return {{"weight", ShardedOverTp(tp_, {num_embeddings_, embedding_dim_}, 0)}};
}

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(int64_t hidden_size, int64_t num_heads,
                                                     c10d::ProcessGroup* tp, bool sequence_parallel,
                                                     bool recompute_core_attn)
    : local_heads_(num_heads / base::GroupSize(tp)),
      head_dim_(hidden_size / num_heads),
      recompute_core_attn_(recompute_core_attn) {
  qkv_ = register_module(
      "qkv", ColumnParallelLinear(hidden_size, 3 * hidden_size, tp,
                                  /*bias=*/true, /*gather_output=*/false, sequence_parallel));
  proj_ = register_module("proj", RowParallelLinear(hidden_size, hidden_size, tp, /*bias=*/true,
                                                    /*input_is_parallel=*/true, sequence_parallel));
}

at::Tensor ParallelSelfAttentionImpl::forward(const at::Tensor& x,
                                              const base::PackedSequences* packed) {
  // The whole sequence's (gathered by qkv under sequence parallelism).
  const at::Tensor qkv = qkv_->forward(x);
  const int64_t batch = qkv.size(0), seq = qkv.size(1);
  // [batch, seq, local heads, (q, k, v), head_dim] -> each [batch, local heads, seq, head_dim].
  // unbind, not three selects: its backward writes the qkv gradient once, where each select's
  // would fill a zero tensor of qkv's size and copy its part in.
  const std::vector<at::Tensor> parts =
      qkv.view({batch, seq, local_heads_, 3, head_dim_}).unbind(3);
  auto part = [&](int64_t i) { return parts[i].transpose(1, 2); };
  const at::Tensor attended =
      RecomputeIf(recompute_core_attn_,
                  [packed](const std::vector<at::Tensor>& heads) {
                    return packed != nullptr ? base::PackedCausalAttention(heads[0], heads[1],
                                                                           heads[2], *packed, 0)
                                             : base::CausalAttention(heads[0], heads[1], heads[2]);
                  },
                  {part(0), part(1), part(2)}, {})
          .transpose(1, 2)
          .contiguous()
          .view({batch, seq, local_heads_ * head_dim_});
  return proj_->forward(attended);
}

}  // namespace keel::parallel
