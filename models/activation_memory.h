// What one rank's activations take in training, from the configuration alone (the trainer's
// --dry_run): Korthikanti et al. 2022's per-layer count (Megatron's activation memory formula,
// "Reducing Activation Recomputation in Large Transformer Models") taken module by module over
// what Keel's layers keep for backward, for each family, under tensor parallelism,
// recomputation and the chunked loss. No dropout masks (Keel's layers have no dropout) and no
// s² term (the attention is LibTorch's fused kernel, which keeps its output and log-normaliser,
// not the probabilities). With a as the activations' bytes, T the tokens of a micro-batch, h
// the hidden size, f the MLP's width, q = heads x head_dim, k = key-value heads x head_dim and
// t the tensor-parallel size, a layer keeps (bytes):
//   GPT:   a·T·(4h + 5h/t + 2f/t)         the norms' inputs and outputs; q, k, v, the
//                                         attention's output and the projection's input; GELU's
//                                         input and output
//   Llama: 2·(4 + 2a)·T·h + a·T·(3q/t + 2k/t + 3f/t)   each RMSNorm's float32 input
//                                         (on a GPU, LibTorch's fused kernel keeps the input
//                                         itself: 3a, not 4 + 2a), normalised values and output;
//                                         q, k, v, the attention's output (and k and v repeated
//                                         to the query heads where the GPU's float32 kernel
//                                         takes no groups), o_proj's input; SwiGLU's gate and
//                                         up (backward makes silu(gate) again) and product
//   a GPT mixture-of-experts layer keeps, in place of GELU's, its router's float32 logits
//   (4·T·experts) and input (4·T·h, where it is not the norm's float32 output itself: in bf16,
//   and with sequence parallelism, whose MoE layers take the whole sequence) and, for the
//   topk x T routed tokens (on average a rank's after the all-to-all), each expert's input,
//   GELU's input and output, and the expert's output, which the routing probability's
//   gradient reads: a·topk·T·(2h + 2f/t)
// Sequence parallelism divides the norms' terms (the 4h and the RMSNorms') and a layer's input
// by t (Korthikanti et al.'s 34/t). "selective" drops what its modules keep beyond their
// inputs; "full" keeps a chunk's input alone and holds one chunk's activations while it runs
// again.
//
//   ActivationMemory memory = EstimateActivations(options, shape);
#ifndef KEEL_MODELS_ACTIVATION_MEMORY_H_
#define KEEL_MODELS_ACTIVATION_MEMORY_H_

#include <algorithm>
#include <cstdint>

#include "models/model_options.h"

namespace keel::models {

// How a rank runs a micro-batch.
struct ActivationShape {
  // Rows and positions of a micro-batch.
  int64_t micro_batch_size = 1;
  int64_t sequence_length = 1;
  // Bytes of an activation element: 4 (float32) or 2 (bf16).
  int64_t activation_bytes = 4;
  // Whether the rank runs on a GPU, whose kernels keep other tensors (the Llama's RMSNorm and
  // grouped-query attention above).
  bool gpu = false;
  int64_t tensor_parallel_size = 1;
  // Megatron's sequence parallelism: the norms and the residual stream hold 1/t of the sequence.
  bool sequence_parallel = false;
  // The layers of the stage, and the micro-batches whose activations it holds at once (1F1B:
  // min(pipeline stages - stage, micro-batches of a step) on stage `stage`).
  int64_t layers = 1;
  int64_t micro_batches_in_flight = 1;
  // Whether the stage ends in the output layer and the loss.
  bool last_stage = true;
};

struct ActivationMemory {
  // One layer's activations kept for backward, without recomputation, for one micro-batch.
  int64_t layer_bytes = 0;
  // What the stage's layers keep for backward for one micro-batch under options.recompute.
  int64_t kept_bytes = 0;
  // The most that recomputation makes again at once in backward: a "full" chunk's layers, or
  // one layer's "selective" modules.
  int64_t recomputed_bytes = 0;
  // The last stage's final norm and loss: kept for backward for one micro-batch, and the
  // logits' transient peak (the whole micro-batch's, or a chunk's).
  int64_t head_kept_bytes = 0;
  int64_t logits_peak_bytes = 0;

  // "full" with "block": the first layers run again at the end of a micro-batch's backward
  // pass, after the later layers and the loss have freed what they kept; the inputs of those
  // first layers are then all it holds. false: recomputation runs beside everything kept.
  bool recomputes_after_release = false;
  int64_t recomputed_inputs_bytes = 0;

  // A step's peak: every micro-batch in flight keeps its share; one's recomputation or logits
  // on top (under "block", its recomputation beside only the first layers' inputs).
  int64_t peak_bytes(int64_t micro_batches_in_flight) const {
    const int64_t held = micro_batches_in_flight * (kept_bytes + head_kept_bytes);
    if (!recomputes_after_release) return held + std::max(recomputed_bytes, logits_peak_bytes);
    return std::max(held + logits_peak_bytes, held - kept_bytes - head_kept_bytes +
                                                  recomputed_inputs_bytes + recomputed_bytes);
  }
};

// Requires: options and a shape the trainer's configuration checks accepted.
ActivationMemory EstimateActivations(const ModelOptions& options, const ActivationShape& shape);

}  // namespace keel::models

#endif  // KEEL_MODELS_ACTIVATION_MEMORY_H_
