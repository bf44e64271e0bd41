// Tensor-parallel layers after Megatron-Core's tensor_parallel/layers.py and its attention:
// each holds its slice of the weights of the whole layer and reports each parameter's layout
// over the mesh (parallel::TensorLayout), so clipping, the gradient syncs and checkpoints
// handle them as the whole tensors they are. With no group (nullptr) or a group of one they
// compute what the ordinary layer does. The layers allocate zeros (parallel/parameters.h) and
// draw nothing: a model gets its weights, as Megatron's master-weight initialisation does, from
// a whole model (CopyFromWholeModel) or from the whole model's draws one parameter at a time
// (InitialiseFromWholeSteps), so the weights at tp = N are exactly the tp = 1 weights, sliced.
//
//   ColumnParallelLinear fc(hidden, ffn, tp);        // weight [ffn / tp, hidden]
//   RowParallelLinear proj(ffn, hidden, tp);         // weight [hidden, ffn / tp]
//   at::Tensor y = proj->forward(at::gelu(fc->forward(x)));  // x and y whole on every rank
//   std::map<std::string, TensorLayout> layouts = ParameterLayouts(*model);
#ifndef KEEL_PARALLEL_TENSOR_PARALLEL_LAYERS_H_
#define KEEL_PARALLEL_TENSOR_PARALLEL_LAYERS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "base/attention.h"
#include "c10/core/ScalarType.h"
#include "parallel/layout.h"
#include "torch/nn/module.h"
#include "torch/nn/pimpl.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::parallel {

// A module whose own parameters (not its children's) have layouts over the mesh.
class LaidOut {
 public:
  virtual ~LaidOut() = default;
  // Each laid-out parameter's layout, by its name in this module ("weight").
  virtual std::map<std::string, TensorLayout> LocalLayouts() const = 0;
};

// A module naming parameters (its own or its submodules') that are whole on every rank but,
// under sequence parallelism, get from each rank's backward pass only the part of their gradient
// that its share of the sequence gives (Megatron's sequence_parallel attribute: norms,
// row-parallel biases): their gradient is the sum over the tensor-parallel group, which the
// trainer takes after the backward passes (Megatron's finalize_model_grads), before clipping
// counts them once.
class SequenceSplit {
 public:
  virtual ~SequenceSplit() = default;
  // Those parameters, by name in this module ("bias", "ln_1.weight").
  virtual std::vector<std::string> LocalSequenceParallelParameters() const = 0;
};

// The parameters of `module` that it or its submodules name as SequenceSplit, by fully
// qualified name, sorted.
std::vector<std::string> SequenceParallelParameters(const torch::nn::Module& module);

// The mesh dimension of the tensor-parallel group in the layouts the layers report.
inline constexpr char kTensorDim[] = "tp";

// The layout of a tensor of `global_shape` split evenly along `dim` over the tensor-parallel
// group `tp` (kTensorDim), as a LaidOut layer reports it. Requires: `dim` < the shape's rank.
TensorLayout ShardedOverTp(c10d::ProcessGroup* tp, std::vector<int64_t> global_shape, int64_t dim);

// The layouts of every parameter of `module` that a LaidOut submodule lays out, by fully
// qualified name; the other parameters are whole on every rank.
std::map<std::string, TensorLayout> ParameterLayouts(const torch::nn::Module& module);

// Copies each parameter of `model` from the parameter of the same name in `whole` (the same
// model without tensor parallelism): the block its layout names, or all of it. Errors:
// kInvalidArgument naming a parameter that `whole` lacks or whose shape does not hold the
// block.
[[nodiscard]] absl::Status CopyFromWholeModel(torch::nn::Module& model,
                                              const torch::nn::Module& whole);

// One parameter of a whole model's initialisation, in the order of its draws: its name, shape
// and dtype, and its values: N(0, std) from the default generator for std > 0, zeros for 0.
struct WholeInitStep {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  double std = 0.0;
};

// What CopyFromWholeModel copies from a whole model initialised by `steps` (the parameters they
// leave out keep `model`'s values), computed one parameter at a time: each step's whole tensor
// is drawn, this rank's block of it copied into `model`'s parameter of that name (if `model`
// holds one: another pipeline stage's is drawn and dropped), and freed. Extra memory: the
// largest parameter. A model on the meta device (parallel::MetaParameters) is left as it is,
// drawing nothing. Errors: kInvalidArgument as CopyFromWholeModel's, for a parameter of
// `model` whose block does not fit its step's shape.
[[nodiscard]] absl::Status InitialiseFromWholeSteps(torch::nn::Module& model,
                                                    const std::vector<WholeInitStep>& steps);

// What an adapter (peft's LoRA) adds to a linear layer's output. Given the input as the layer
// received it (a row-parallel layer's: this rank's features; under sequence parallelism a
// column-parallel layer's: this rank's share of the sequence), it returns a tensor shaped as the
// layer's output at the point the layer adds it: a column-parallel layer's features of this
// rank before any gather, over the whole sequence; a row-parallel layer's whole output after
// the all-reduce (under sequence parallelism this rank's share of the sequence after the
// reduce-scatter), before the bias (at one rank, after the layer's fused bias). It runs the
// collectives it needs itself.
class LinearAdapter : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
};

// X A^T + b for a column-parallel layer's rows A of the weight and b of the bias (undefined:
// none), as ColumnParallelLinear computes it: X [..., seq, in] whole on every rank, or with
// sequence_parallel (and tp of more than one rank) this rank's share of the sequence, gathered
// first (LinearWithGradAccumulation); [..., seq, rows] either way. The weight's gradient goes
// into its main gradient where a sync offers one (parallel/main_grad.h), as in every layer
// here. Collective over `tp`.
at::Tensor ColumnParallelProduct(const at::Tensor& input, const at::Tensor& weight,
                                 const at::Tensor& bias, c10d::ProcessGroup* tp,
                                 bool sequence_parallel);

// The input region of a column-parallel layer whose product is computed elsewhere (the output
// layer inside LinearCrossEntropy): `input` through CopyToTensorParallelRegion, or with
// sequence_parallel its sequence gathered (GatherFromSequenceParallelRegion). Collective over
// `tp`.
at::Tensor ColumnParallelInput(const at::Tensor& input, c10d::ProcessGroup* tp,
                               bool sequence_parallel);

// Y = X A^T + b with A's rows (the output features) split over `tp`: weight [out / tp, in],
// bias [out / tp]. The input is whole on every rank (with sequence_parallel this rank's share of
// the sequence, which the layer gathers); the output is this rank's features over the whole
// sequence, or with gather_output all of them.
class ColumnParallelLinearImpl : public torch::nn::Module, public LaidOut {
 public:
  // Requires: tp's size divides output_size; not both gather_output and sequence_parallel.
  ColumnParallelLinearImpl(int64_t input_size, int64_t output_size, c10d::ProcessGroup* tp,
                           bool bias = true, bool gather_output = false,
                           bool sequence_parallel = false);
  at::Tensor forward(const at::Tensor& input);
  std::map<std::string, TensorLayout> LocalLayouts() const override;
  // Registers `adapter` as the submodule "adapter", whose output forward adds. Requires: none
  // registered yet.
  void Adapt(std::shared_ptr<LinearAdapter> adapter);
  bool adapted() const { return adapter_ != nullptr; }
  // This rank's rows of the weight, [output_size / tp, input_size].
  const at::Tensor& weight() const { return weight_; }
  int64_t input_size() const { return input_size_; }
  int64_t output_size() const { return output_size_; }
  c10d::ProcessGroup* tp() const { return tp_; }
  // Whether the input is this rank's share of the sequence (false on one rank).
  bool sequence_parallel() const { return sequence_parallel_; }

  // What each of `layers` returns for the same `input` (its forward, adapter included), from
  // one matrix product of their weights stacked by rows and, under sequence parallelism, one
  // gather of the input: Megatron's fused linear_qkv and linear_fc1 over weights that keep
  // their own names and blocks. Requires: at least one layer; all share tp, sequence_parallel
  // and input_size; all or none have a bias; none gathers its output.
  static std::vector<at::Tensor> ForwardStacked(
      const at::Tensor& input, const std::vector<ColumnParallelLinearImpl*>& layers);

 private:
  // `output` (this layer's product of `input`) with the adapter's output added.
  at::Tensor Adapted(at::Tensor output, const at::Tensor& input);

  int64_t input_size_, output_size_;
  c10d::ProcessGroup* tp_;
  bool gather_output_, sequence_parallel_;
  at::Tensor weight_, bias_;
  std::shared_ptr<LinearAdapter> adapter_;
};
TORCH_MODULE(ColumnParallelLinear);

// Y = X A^T + b with A's columns (the input features) split over `tp`: weight [out, in / tp],
// bias [out] whole. The input is this rank's features (with input_is_parallel) or whole; the
// output, summed over the group, is whole on every rank, or with sequence_parallel (and tp of
// more than one rank) reduce-scattered to this rank's share of the sequence, the bias added
// after the sum (its gradient then this rank's part: a SequenceSplit parameter).
class RowParallelLinearImpl : public torch::nn::Module, public LaidOut, public SequenceSplit {
 public:
  // Requires: tp's size divides input_size; input_is_parallel with sequence_parallel.
  RowParallelLinearImpl(int64_t input_size, int64_t output_size, c10d::ProcessGroup* tp,
                        bool bias = true, bool input_is_parallel = true,
                        bool sequence_parallel = false);
  at::Tensor forward(const at::Tensor& input);
  std::map<std::string, TensorLayout> LocalLayouts() const override;
  std::vector<std::string> LocalSequenceParallelParameters() const override;
  // Registers `adapter` as the submodule "adapter", whose output forward adds. Requires: none
  // registered yet.
  void Adapt(std::shared_ptr<LinearAdapter> adapter);
  int64_t input_size() const { return input_size_; }
  int64_t output_size() const { return output_size_; }
  c10d::ProcessGroup* tp() const { return tp_; }
  // Whether the output is this rank's share of the sequence (false on one rank).
  bool sequence_parallel() const { return sequence_parallel_; }

 private:
  int64_t input_size_, output_size_;
  c10d::ProcessGroup* tp_;
  bool input_is_parallel_, sequence_parallel_;
  at::Tensor weight_, bias_;
  std::shared_ptr<LinearAdapter> adapter_;
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose vocabulary is split over `tp`: weight [vocab / tp, dim], rank r holding
// rows [r x vocab / tp, (r + 1) x vocab / tp); each rank looks up the tokens of its slice and
// the sum over the group gives every rank the whole embedding, or with reduce_scatter_embeddings
// (Megatron's, for sequence parallelism) this rank's share of the sequence of it.
class VocabParallelEmbeddingImpl : public torch::nn::Module, public LaidOut {
 public:
  // Requires: tp's size divides num_embeddings (pad the vocabulary first).
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, c10d::ProcessGroup* tp,
                             bool reduce_scatter_embeddings = false);
  at::Tensor forward(const at::Tensor& tokens);
  std::map<std::string, TensorLayout> LocalLayouts() const override;
  const at::Tensor& weight() const { return weight_; }

 private:
  int64_t num_embeddings_, embedding_dim_;
  c10d::ProcessGroup* tp_;
  bool reduce_scatter_embeddings_;
  at::Tensor weight_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Causal self-attention with its heads split over `tp`: "qkv" a column-parallel projection
// whose rows go head by head ([q, k, v] of head 0, then of head 1, ...: Megatron's fused
// linear_qkv, so that each rank's rows are its heads'), the attention of this rank's heads,
// and "proj" a row-parallel projection back to the whole hidden size; with sequence_parallel
// both are (the attention itself runs over the whole sequence, which qkv gathers).
class ParallelSelfAttentionImpl : public torch::nn::Module {
 public:
  // Requires: tp's size divides num_heads, which divides hidden_size.
  ParallelSelfAttentionImpl(int64_t hidden_size, int64_t num_heads, c10d::ProcessGroup* tp,
                            bool sequence_parallel = false, bool recompute_core_attn = false);
  // `x` [batch, seq, hidden] whole (with sequence_parallel this rank's share of the sequence);
  // each position attends to itself and the positions before it (base::CausalAttention:
  // LibTorch's fused kernel), within its sequence of `packed` (of the whole sequence) when not
  // nullptr (base::PackedCausalAttention); with recompute_core_attn that attention keeps only q,
  // k and v for backward and runs again in it (parallel/recompute.h's kCoreAttn). Returns x's
  // shape, whole (or this rank's share).
  at::Tensor forward(const at::Tensor& x, const base::PackedSequences* packed);

 private:
  int64_t local_heads_, head_dim_;
  bool recompute_core_attn_;
  ColumnParallelLinear qkv_{nullptr};
  RowParallelLinear proj_{nullptr};
};
TORCH_MODULE(ParallelSelfAttention);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_TENSOR_PARALLEL_LAYERS_H_
