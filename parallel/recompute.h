// Activation recomputation, as Megatron-Core trains long sequences and large models: a run of
// layers keeps only its input, and backward runs it again with gradients on
// (tensor_parallel/random.py's checkpoint, recompute.py's choice of layers). LibTorch's C++
// API has no torch.utils.checkpoint; Recompute is an autograd node of its own whose inputs are
// the run's input and the parameters it reads, so that it works when the input needs no
// gradient (a frozen embedding under LoRA: the trap of transformers#26221, where re-entrant
// checkpointing drops every gradient).
//
//   RecomputeOptions options;  // model.recompute_granularity "full", method "uniform", 1 layer
//   at::Tensor y = RunLayers(layers.size(), options, /*training=*/true,
//                            [&](int64_t i, const at::Tensor& x) { return layers[i](x); },
//                            [&](int64_t i) { return ParametersOf(layers[i]); }, x);
#ifndef KEEL_PARALLEL_RECOMPUTE_H_
#define KEEL_PARALLEL_RECOMPUTE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"

namespace keel::parallel {

// Megatron-Core's recompute_granularity: whole layers, or modules inside every layer.
enum class RecomputeGranularity { kFull, kSelective };
bool AbslParseFlag(absl::string_view text, RecomputeGranularity* out, std::string* error);
std::string AbslUnparseFlag(RecomputeGranularity granularity);

// Megatron-Core's recompute_method: which layers a "full" recomputation covers.
enum class RecomputeMethod { kUniform, kBlock };
bool AbslParseFlag(absl::string_view text, RecomputeMethod* out, std::string* error);
std::string AbslUnparseFlag(RecomputeMethod method);

// The modules of a layer that "selective" recomputes (Megatron-Core's names): the attention of
// the projected heads (softmax(QKᵀ)V, with grouped-query attention's repeated key-value heads);
// the MLP (or the mixture of experts, with its router); the layer's norms (input_layernorm and
// the one before the MLP).
inline constexpr char kCoreAttn[] = "core_attn";
inline constexpr char kMlp[] = "mlp";
inline constexpr char kLayernorm[] = "layernorm";

// Megatron-Core's TransformerConfig fields of the same names, its defaults and checks
// (CheckRecomputeOptions).
struct RecomputeOptions {
  // kFull: whole layers; kSelective: recompute_modules inside each layer; unset: none.
  // Default: unset.
  std::optional<RecomputeGranularity> recompute_granularity;
  // kFull only, required: kUniform, the stage's layers in chunks of recompute_num_layers, each
  // chunk's input saved and the chunk run again; kBlock, the first recompute_num_layers layers
  // of each pipeline stage, one at a time, the rest not recomputed. Default: unset.
  std::optional<RecomputeMethod> recompute_method;
  // kFull only, required, at least 1. Default: unset.
  std::optional<int64_t> recompute_num_layers;
  // kSelective: the modules recomputed in every layer: kCoreAttn, kMlp, kLayernorm. Default:
  // {kCoreAttn}.
  std::vector<std::string> recompute_modules = {kCoreAttn};
};

// Whether `options` recomputes `module` (kCoreAttn, kMlp, kLayernorm) in every layer: the
// granularity "selective" and the module listed.
bool RecomputesModule(const RecomputeOptions& options, absl::string_view module);

template <typename O, typename V, base::IsFieldsOf<O, RecomputeOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("recompute_granularity", o.recompute_granularity);
  v("recompute_method", o.recompute_method);
  v("recompute_num_layers", o.recompute_num_layers);
  v("recompute_modules", o.recompute_modules);
}

// Megatron's checks, each an error naming the field (kInvalidArgument): a method and a layer
// count with "full", the count in [1, layers_per_stage]; neither with "selective", whose modules
// must be ones listed above.
absl::Status CheckRecomputeOptions(const RecomputeOptions& options, int64_t layers_per_stage);

// What Recompute runs: a function of its inputs (and of parameters it reads).
using RecomputedFunction = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// f(inputs) without keeping f's inner activations; in backward, f runs again on the kept
// inputs with gradients on (the default generators' states set back to the forward's for the
// run, so that dropout draws the same masks), and the output's gradient flows through it to the
// inputs and to `parameters` (the tensors f reads that may need gradients: its modules'
// parameters), whose gradients accumulate as without recomputation (their hooks called once).
// Without grad mode, or when no input or parameter needs a gradient, just f(inputs). Requires:
// f a function of its inputs, the parameters and the generators, that outlives the backward
// pass with all it captures; every rank of a group runs the same recomputations, if f holds
// collectives.
at::Tensor Recompute(const RecomputedFunction& f, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& parameters);

// Recompute(f, inputs, parameters) when `recompute`, else f(inputs): a module that "selective"
// may recompute.
at::Tensor RecomputeIf(bool recompute, const RecomputedFunction& f,
                       const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& parameters);

// A stage's `count` layers over `input` in order (`layer(i, x)`), recomputed as `options`'
// "full" granularity says when `training`: each uniform chunk, or the first block of layers,
// through Recompute with the parameters `parameters_of` gives for its layers. Requires: `layer`
// outlives the backward pass with all it captures (capture by value).
at::Tensor RunLayers(int64_t count, const RecomputeOptions& options, bool training,
                     const std::function<at::Tensor(int64_t, const at::Tensor&)>& layer,
                     const std::function<std::vector<at::Tensor>(int64_t)>& parameters_of,
                     const at::Tensor& input);

}  // namespace keel::parallel

#endif  // KEEL_PARALLEL_RECOMPUTE_H_
