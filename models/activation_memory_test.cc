// The activation estimate against the per-layer counts worked by hand from the modules' saved
// tensors (the header's formulas), and what recomputation and the chunked loss change.
#include "models/activation_memory.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace keel::models {
namespace {

// GPT: h 64, f 256, 4 heads; a micro-batch of 2 x 32 tokens in float32 on one rank.
ModelOptions Gpt() {
  ModelOptions options;
  options.hidden_size = 64;
  options.ffn_hidden_size = 256;
  options.num_attention_heads = 4;
  options.vocab_size = 256;
  return options;
}

ActivationShape Shape(int64_t layers, int64_t tp = 1, int64_t bytes = 4) {
  ActivationShape shape;
  shape.micro_batch_size = 2;
  shape.sequence_length = 32;
  shape.activation_bytes = bytes;
  shape.tensor_parallel_size = tp;
  shape.layers = layers;
  return shape;
}

constexpr int64_t kTokens = 64;

TEST(ActivationMemoryTest, AGptLayerKeepsKorthikantisTermsWithoutMasksOrSquares) {
  // 4h (norms) + 5h (q, k, v, attention output, projection input) + 2f (GELU), float32.
  const ActivationMemory one = EstimateActivations(Gpt(), Shape(4));
  EXPECT_EQ(one.layer_bytes, 4 * kTokens * (4 * 64 + 5 * 64 + 2 * 256));
  EXPECT_EQ(one.kept_bytes, 4 * one.layer_bytes);
  // tp = 2 halves the tensor-parallel regions only; bf16 halves everything.
  const ActivationMemory tp2 = EstimateActivations(Gpt(), Shape(4, 2, 2));
  EXPECT_EQ(tp2.layer_bytes, 2 * kTokens * (4 * 64 + (5 * 64 + 2 * 256) / 2));
  // Sequence parallelism divides the norms' share too: all of it by t.
  ActivationShape sequence_parallel = Shape(4, 2, 2);
  sequence_parallel.sequence_parallel = true;
  EXPECT_EQ(EstimateActivations(Gpt(), sequence_parallel).layer_bytes,
            2 * kTokens * (4 * 64 + 5 * 64 + 2 * 256) / 2);
}

TEST(ActivationMemoryTest, AGptExpertLayerKeepsTheRoutersInputsAndTheRoutedTokens) {
  ModelOptions options = Gpt();
  options.num_moe_experts = 4;
  options.moe_router_topk = 2;
  const int64_t attention_and_norms = 4 * 64 + 5 * 64;
  // float32: the router's logits (4 experts) and, for the 2 x T routed tokens, each expert's
  // input, GELU's input and output and the expert's output; the router reads the norm's output
  // itself.
  const int64_t routed = 2 * (2 * 64 + 2 * 256);
  EXPECT_EQ(EstimateActivations(options, Shape(1)).layer_bytes,
            4 * kTokens * (attention_and_norms + 4 + routed));
  // bf16: the router keeps a float32 copy of its input (h) beside its float32 logits.
  EXPECT_EQ(EstimateActivations(options, Shape(1, 1, 2)).layer_bytes,
            2 * kTokens * (attention_and_norms + routed) + 4 * kTokens * (4 + 64));
  // Sequence parallelism at tp = 2: the norms hold half of the sequence, the expert layer takes
  // it whole (the router's gathered input too).
  ActivationShape sequence_parallel = Shape(1, 2, 2);
  sequence_parallel.sequence_parallel = true;
  EXPECT_EQ(EstimateActivations(options, sequence_parallel).layer_bytes,
            2 * kTokens * (4 * 64 / 2 + 5 * 64 / 2 + 2 * (2 * 64 + 256)) + 4 * kTokens * (4 + 64));
}

TEST(ActivationMemoryTest, ALlamaLayerKeepsItsNormsFloat32AndItsGroupedHeads) {
  ModelOptions options = Gpt();
  options.family = ModelFamily::kLlama;
  options.num_query_groups = 2;  // q = 64, k = v = 32
  // 2 RMSNorms x (float32 input + normalised + output) + q, k, v, the attention's output,
  // o_proj's input + 3f (SwiGLU's gate, up and product), in bf16.
  const ActivationMemory memory = EstimateActivations(options, Shape(1, 1, 2));
  EXPECT_EQ(memory.layer_bytes,
            2 * (4 + 2 * 2) * kTokens * 64 + 2 * kTokens * (3 * 64 + 2 * 32 + 3 * 256));
  // Selective core_attn keeps q, k and v (kept anyway) and drops the attention's output.
  options.recompute.recompute_granularity = parallel::RecomputeGranularity::kSelective;
  const ActivationMemory selective = EstimateActivations(options, Shape(1, 1, 2));
  EXPECT_EQ(memory.kept_bytes - selective.kept_bytes, 2 * kTokens * 64);
}

TEST(ActivationMemoryTest, OnAGpuTheFusedRmsNormKeepsNoFloat32CopyAndFloat32RepeatsHeads) {
  ModelOptions options = Gpt();
  options.family = ModelFamily::kLlama;
  options.num_query_groups = 2;  // q = 64, k = v = 32
  ActivationShape bf16 = Shape(1, 1, 2);
  bf16.gpu = true;
  // Each RMSNorm: its bf16 input, normalised values and output.
  EXPECT_EQ(EstimateActivations(options, bf16).layer_bytes,
            2 * (3 * 2) * kTokens * 64 + 2 * kTokens * (3 * 64 + 2 * 32 + 3 * 256));
  // float32: the input is the float32 copy; the memory-efficient kernel takes k and v repeated
  // to the 64 query dimensions.
  ActivationShape float32 = Shape(1, 1, 4);
  float32.gpu = true;
  EXPECT_EQ(EstimateActivations(options, float32).layer_bytes,
            2 * (3 * 4) * kTokens * 64 + 4 * kTokens * (5 * 64 + 3 * 256));
}

TEST(ActivationMemoryTest, FullRecomputationKeepsEachChunksInput) {
  ModelOptions options = Gpt();
  const ActivationMemory plain = EstimateActivations(options, Shape(4));
  options.recompute.recompute_granularity = parallel::RecomputeGranularity::kFull;
  options.recompute.recompute_method = parallel::RecomputeMethod::kUniform;
  options.recompute.recompute_num_layers = 2;
  const ActivationMemory uniform = EstimateActivations(options, Shape(4));
  EXPECT_EQ(uniform.kept_bytes, 2 * 4 * kTokens * 64);  // two chunks' inputs
  EXPECT_EQ(uniform.recomputed_bytes, 2 * plain.layer_bytes);
  options.recompute.recompute_method = parallel::RecomputeMethod::kBlock;
  options.recompute.recompute_num_layers = 1;
  const ActivationMemory block = EstimateActivations(options, Shape(4));
  EXPECT_EQ(block.kept_bytes, 4 * kTokens * 64 + 3 * plain.layer_bytes);
  // The first layer runs again only after the other three and the loss freed theirs: the peak
  // is at the start of backward, with the logits' gradient, not the recomputation on top.
  EXPECT_EQ(block.peak_bytes(1),
            block.kept_bytes + block.head_kept_bytes + block.logits_peak_bytes);
  // Two micro-batches in flight: the later one's first layer runs again beside the earlier
  // one's whole share.
  EXPECT_EQ(
      block.peak_bytes(2),
      std::max(2 * (block.kept_bytes + block.head_kept_bytes) + block.logits_peak_bytes,
               block.kept_bytes + block.head_kept_bytes + 4 * kTokens * 64 + plain.layer_bytes));
  // Every layer recomputed: their inputs, and one layer made again or the loss's peak.
  options.recompute.recompute_num_layers = 4;
  const ActivationMemory all = EstimateActivations(options, Shape(4));
  EXPECT_EQ(all.kept_bytes, 4 * 4 * kTokens * 64);
  EXPECT_EQ(
      all.peak_bytes(1),
      all.kept_bytes + std::max(all.head_kept_bytes + all.logits_peak_bytes, plain.layer_bytes));
  // Selective mlp and layernorm drop GELU's two and the norms' inputs' copies beyond one each.
  options.recompute = {};
  options.recompute.recompute_granularity = parallel::RecomputeGranularity::kSelective;
  options.recompute.recompute_modules = {parallel::kMlp};
  const ActivationMemory mlp = EstimateActivations(options, Shape(1));
  EXPECT_EQ(mlp.kept_bytes, plain.layer_bytes - 4 * kTokens * 2 * 256);
  EXPECT_EQ(mlp.recomputed_bytes, 4 * kTokens * 2 * 256);  // while its backward runs
}

TEST(ActivationMemoryTest, TheChunkedLossHoldsAChunksLogits) {
  ModelOptions options = Gpt();
  options.vocab_size = 1000;  // padded to 1024
  options.cross_entropy_chunk_len = 0;
  const ActivationMemory whole = EstimateActivations(options, Shape(1));
  // The final norm's input and output, and the float32 log-probabilities; the gradient beside.
  EXPECT_EQ(whole.head_kept_bytes, 2 * 4 * kTokens * 64 + 4 * kTokens * 1024);
  EXPECT_EQ(whole.logits_peak_bytes, 4 * kTokens * 1024);
  options.cross_entropy_chunk_len = 16;
  const ActivationMemory chunked = EstimateActivations(options, Shape(1));
  EXPECT_EQ(chunked.head_kept_bytes, 2 * 4 * kTokens * 64 + 8 * kTokens);
  EXPECT_EQ(chunked.logits_peak_bytes, 16 * 1024 * 12);
  EXPECT_LT(chunked.peak_bytes(1), whole.peak_bytes(1));
}

// Over tensor parallelism, and on one rank in Keel's kernels (bf16 on a GPU), the loss keeps the
// logits in their dtype and a float32 log-normaliser a position, not float32 log-probabilities.
TEST(ActivationMemoryTest, TheLossKeepsTheLogitsInTheirDtypeOverRanksAndInKeelsKernels) {
  ModelOptions options = Gpt();
  options.vocab_size = 1000;  // padded to 1024: 512 columns a rank over 2
  options.cross_entropy_chunk_len = 0;
  const int64_t final_norm = 2 * kTokens * 64;  // its input and output, times the bytes
  const ActivationMemory tp2 = EstimateActivations(options, Shape(1, 2, 2));
  EXPECT_EQ(tp2.head_kept_bytes, 2 * final_norm + 2 * kTokens * 512 + 4 * kTokens);
  // The bf16 gradient beside its float32 working copy.
  EXPECT_EQ(tp2.logits_peak_bytes, (4 + 2) * kTokens * 512);
  const ActivationMemory tp2_float32 = EstimateActivations(options, Shape(1, 2, 4));
  EXPECT_EQ(tp2_float32.head_kept_bytes, 4 * final_norm + 4 * kTokens * 512 + 4 * kTokens);
  EXPECT_EQ(tp2_float32.logits_peak_bytes, 4 * kTokens * 512);

  ActivationShape on_gpu = Shape(1, 1, 2);
  on_gpu.gpu = true;
  const ActivationMemory kernels = EstimateActivations(options, on_gpu);
  EXPECT_EQ(kernels.head_kept_bytes, 2 * final_norm + 2 * kTokens * 1024 + 4 * kTokens);
  EXPECT_EQ(kernels.logits_peak_bytes, 2 * kTokens * 1024);
  // Chunked: a chunk's bf16 logits and their bf16 gradient, no float32 copies.
  options.cross_entropy_chunk_len = 16;
  EXPECT_EQ(EstimateActivations(options, on_gpu).logits_peak_bytes, 16 * 1024 * (2 + 2));
}

}  // namespace
}  // namespace keel::models
