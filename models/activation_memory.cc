#include "models/activation_memory.h"

#include <algorithm>

#include "parallel/recompute.h"

namespace keel::models {
namespace {

constexpr int64_t kFloat32 = 4;

// One layer's bytes kept for backward, by part, for a micro-batch of `tokens`.
struct LayerParts {
  // The norms' inputs (recomputation keeps them) and what else they keep: the outputs that
  // the next projections read, and a Llama RMSNorm's normalised values (and float32 input).
  int64_t norm_inputs = 0, norm_rest = 0;
  // The attention's q, k and v as projected (its recomputation's inputs), and what the fused
  // kernel keeps beyond them (its output, and k and v if it repeats them to the query heads),
  // and the output projection's input.
  int64_t attention_inputs = 0, attention_rest = 0, projection_input = 0;
  // The MLP's activations beyond its input (the second norm's output).
  int64_t mlp = 0;

  int64_t total() const {
    return norm_inputs + norm_rest + attention_inputs + attention_rest + projection_input + mlp;
  }
};

// The positions of the norms' and the residual stream's tensors on a rank.
int64_t NormRegionTokens(const ActivationShape& shape) {
  const int64_t tokens = shape.micro_batch_size * shape.sequence_length;
  return shape.sequence_parallel ? tokens / shape.tensor_parallel_size : tokens;
}

LayerParts Parts(const ModelOptions& options, const ActivationShape& shape) {
  const int64_t a = shape.activation_bytes, t = shape.tensor_parallel_size;
  const int64_t tokens = shape.micro_batch_size * shape.sequence_length;
  const int64_t split = NormRegionTokens(shape);
  const int64_t h = options.hidden_size, f = options.ffn_hidden_size;
  LayerParts parts;
  if (options.family == ModelFamily::kGpt) {
    parts.norm_inputs = 2 * a * split * h;
    parts.norm_rest = 2 * a * split * h;
    parts.attention_inputs = 3 * a * tokens * h / t;
    parts.attention_rest = a * tokens * h / t;
    parts.projection_input = a * tokens * h / t;
    // The router keeps its float32 input: the norm's output itself in a float32 run (counted
    // above); a float32 copy in bf16, or the whole sequence, gathered, with sequence
    // parallelism (counted here).
    const bool router_input = a != kFloat32 || shape.sequence_parallel;
    parts.mlp = options.num_moe_experts > 0
                    ? kFloat32 * tokens * (options.num_moe_experts + (router_input ? h : 0)) +
                          a * options.moe_router_topk * tokens * (2 * h + 2 * f / t)
                    : 2 * a * tokens * f / t;
    return parts;
  }
  const int64_t q = options.num_attention_heads * HeadDim(options);
  const int64_t kv = KvHeads(options) * HeadDim(options);
  // Each RMSNorm keeps its input (a float32 copy of it, except LibTorch's fused kernel on a
  // GPU), its normalised values and its output.
  const int64_t norm_keeps = shape.gpu ? 3 * a : kFloat32 + 2 * a;
  parts.norm_inputs = 2 * a * split * h;
  parts.norm_rest = 2 * norm_keeps * split * h - parts.norm_inputs;
  parts.attention_inputs = a * tokens * (q + 2 * kv) / t;
  // The fused attention's output; k and v repeated to the query heads only where it takes no
  // groups (the GPU's float32 kernel).
  const bool repeats = shape.gpu && a == kFloat32;
  parts.attention_rest = a * tokens * ((repeats ? 2 * (q - kv) : 0) + q) / t;
  parts.projection_input = a * tokens * q / t;
  // SwiGLU's gate and up (views of one product) and down_proj's input; no silu(gate).
  parts.mlp = 3 * a * tokens * f / t;
  return parts;
}

}  // namespace

ActivationMemory EstimateActivations(const ModelOptions& options, const ActivationShape& shape) {
  const parallel::RecomputeOptions& recompute = options.recompute;
  const LayerParts whole = Parts(options, shape);
  LayerParts parts = whole;
  const int64_t a = shape.activation_bytes, t = shape.tensor_parallel_size;
  const int64_t tokens = shape.micro_batch_size * shape.sequence_length;
  const int64_t h = options.hidden_size;
  ActivationMemory memory;
  memory.layer_bytes = whole.total();
  if (parallel::RecomputesModule(recompute, parallel::kCoreAttn)) parts.attention_rest = 0;
  if (parallel::RecomputesModule(recompute, parallel::kMlp)) parts.mlp = 0;
  if (parallel::RecomputesModule(recompute, parallel::kLayernorm)) {
    // The norms' outputs stay: the projections after them keep them.
    parts.norm_rest = std::min(parts.norm_rest, parts.norm_inputs);
  }
  const int64_t layer = parts.total();
  // Selective: one layer's recomputed modules exist again while its backward runs.
  memory.recomputed_bytes = whole.total() - layer;
  const int64_t input = a * NormRegionTokens(shape) * h;
  const int64_t layers = shape.layers;
  memory.kept_bytes = layers * layer;
  if (recompute.recompute_granularity == parallel::RecomputeGranularity::kFull) {
    const int64_t n = std::min(layers, recompute.recompute_num_layers.value_or(1));
    if (recompute.recompute_method == parallel::RecomputeMethod::kUniform) {
      memory.kept_bytes = (layers + n - 1) / n * input;
      memory.recomputed_bytes = n * layer;
    } else {
      memory.kept_bytes = n * input + (layers - n) * layer;
      memory.recomputed_bytes = n > 0 ? layer : 0;
      memory.recomputes_after_release = true;
      memory.recomputed_inputs_bytes = n * input;
    }
  }
  if (!shape.last_stage) return memory;
  const int64_t vocab = PaddedVocabSize(options, t) / t;
  // The final norm as a layer's first, then the loss (parallel/tensor_parallel/cross_entropy.h).
  // bf16 logits on a GPU take Keel's kernels, which keep no float32 copy of them.
  const bool kernels = shape.gpu && a == 2;
  const int64_t chunk_len = CrossEntropyChunkLen(options);
  memory.head_kept_bytes = (whole.norm_inputs + whole.norm_rest) / 2;
  if (chunk_len > 0) {
    // Two float32 numbers a position (the log-normaliser and the target's logit); a chunk's
    // logits and its gradient in the activations' dtype, and without the kernels its float32
    // logits and their exponentials.
    memory.head_kept_bytes += 2 * kFloat32 * tokens;
    memory.logits_peak_bytes =
        std::min(chunk_len, tokens) * vocab * (kernels ? 2 * a : 2 * kFloat32 + a);
  } else if (t == 1 && !kernels) {
    // ATen's float32 log-probabilities; their gradient in the activations' dtype beside them.
    memory.head_kept_bytes += kFloat32 * tokens * vocab;
    memory.logits_peak_bytes = tokens * vocab * a;
  } else {
    // The logits in their dtype and a float32 log-normaliser a position; their gradient beside,
    // and without the kernels its float32 working copy (the gradient itself in float32).
    memory.head_kept_bytes += a * tokens * vocab + kFloat32 * tokens;
    memory.logits_peak_bytes = tokens * vocab * (kernels || a == kFloat32 ? a : kFloat32 + a);
  }
  return memory;
}

}  // namespace keel::models
