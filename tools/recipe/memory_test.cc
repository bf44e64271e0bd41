// The bytes per parameter against Megatron-Core's table for its distributed optimizer
// (docs/source/api-guide/dist_optimizer.md: float32 16 bytes, 8 + 8/d sharded over d ranks;
// bf16 with float32 main gradients 18, 6 + 12/d; with bf16 main gradients 16, 4 + 12/d), and
// where Keel holds more: unsharded, its data-parallel buckets are a copy of the float32 .grad
// (4 bytes more with more than one rank; sharded, backward adds into the buckets and no .grad
// exists), and a sharded bf16 run with float32 main gradients all-gathers the parameters into
// a buffer of their own (2 more); Megatron's parameters and gradients are views of those
// buffers.
#include "tools/recipe/memory.h"

#include <cstdint>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "parallel/mesh_layout.h"
#include "testing/status_matchers.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TrainOptions Options(bool bf16, bool sharded) {
  TrainOptions options;
  options.model.hidden_size = 64;
  options.model.num_layers = 2;
  options.model.num_attention_heads = 4;
  options.model.ffn_hidden_size = 256;
  options.local_batch_size = 1;
  options.step_scheduler.global_batch_size = 4;
  options.data.dataset.sequence_length = 32;
  options.bf16 = bf16;
  options.distributed.use_distributed_optimizer = sharded;
  return options;
}

// Bytes per parameter of the rank of `options` on `world` data-parallel ranks.
double BytesPerParameter(const TrainOptions& options, int world) {
  const parallel::MeshLayout layout =
      *parallel::MeshLayout::Create(options.distributed.parallel, world);
  const RankMemory memory = EstimateRankMemory(options, layout);
  const int64_t n = memory.parameters.dense + memory.parameters.experts;
  EXPECT_EQ(n, models::CountStageParameters(options.model, {}, 0).dense);
  return static_cast<double>(memory.total_bytes()) / static_cast<double>(n);
}

TEST(MemoryTest, BytesPerParameterAreMegatronsWhereTheBuffersAgree) {
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(false, false), 1), 16);
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(true, false), 1), 18);
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(true, false), 4), 18);
  TrainOptions bf16_grads = Options(true, true);
  bf16_grads.distributed.grad_reduce_in_fp32 = false;
  EXPECT_DOUBLE_EQ(BytesPerParameter(bf16_grads, 4), 4 + 12.0 / 4);
  bf16_grads.distributed.use_distributed_optimizer = false;
  EXPECT_DOUBLE_EQ(BytesPerParameter(bf16_grads, 1), 16);
}

TEST(MemoryTest, KeelsOwnBuffersCostWhatTheyHold) {
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(false, false), 4), 16 + 4);
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(false, true), 4), 8 + 8.0 / 4);  // Megatron's
  EXPECT_DOUBLE_EQ(BytesPerParameter(Options(true, true), 4), 6 + 12.0 / 4 + 2);
}

// Shards divide the parameters of a stage, and the stage with the embedding and the head
// holds the most; the dry run's lines name the precision, and whether the weight gradients go
// into the main gradients from their GEMMs.
TEST(MemoryTest, PrintsThePrecisionAndTheLargestStage) {
  TrainOptions options = Options(true, false);
  options.model.num_layers = 4;
  options.distributed.parallel.pipeline_model_parallel_size = 4;
  const parallel::MeshLayout layout =
      *parallel::MeshLayout::Create(options.distributed.parallel, 4);
  const RankMemory memory = EstimateRankMemory(options, layout);
  EXPECT_EQ(memory.stage, 0);  // the word and position embeddings
  EXPECT_EQ(memory.parameters.dense,
            models::CountStageParameters(options.model, layout.options(), 0).dense);
  std::ostringstream out;
  PrintPrecisionAndMemory(options, layout, out);
  EXPECT_THAT(out.str(), HasSubstr("precision: bf16 parameters and activations; main gradients "
                                   "in float32 (the linear layers' weight gradients added from "
                                   "their GEMMs), float32 main parameters and AdamW state"));
  EXPECT_THAT(out.str(), HasSubstr("memory per rank (pipeline stage 0 of 4, the largest): "));
  options.distributed.gradient_accumulation_fusion = false;
  std::ostringstream unfused;
  PrintPrecisionAndMemory(options, layout, unfused);
  EXPECT_THAT(unfused.str(), HasSubstr("main gradients in float32, float32 main parameters"));
  std::ostringstream fp32;
  PrintPrecisionAndMemory(Options(false, false), *parallel::MeshLayout::Create({}, 1), fp32);
  EXPECT_THAT(fp32.str(), HasSubstr("precision: float32\n"));
  EXPECT_THAT(fp32.str(), ::testing::Not(HasSubstr("main parameters")));
}

// LoRA: the model's weights are frozen, with no gradients or optimizer state of their own.
TEST(MemoryTest, LoraCountsOnlyTheFrozenWeights) {
  TrainOptions options = Options(true, false);
  options.peft.emplace();
  const parallel::MeshLayout layout = *parallel::MeshLayout::Create({}, 1);
  const RankMemory memory = EstimateRankMemory(options, layout);
  EXPECT_EQ(memory.weight_bytes, 2 * memory.parameters.dense);
  EXPECT_EQ(memory.total_bytes(), memory.weight_bytes);
  std::ostringstream out;
  PrintPrecisionAndMemory(options, layout, out);
  EXPECT_THAT(out.str(), HasSubstr("(no gradients, no optimizer state), plus the LoRA adapters'"));
}

// Refused where the state cannot fit, by Megatron's 16 bytes a float32 parameter (above) on the
// device, and by the 4 of the float32 weights built on the CPU whatever the run's dtype.
TEST(MemoryTest, AModelStateThatCannotFitIsRefusedBeforeItIsBuilt) {
  const parallel::MeshLayout layout = *parallel::MeshLayout::Create({}, 1);
  const TrainOptions fp32 = Options(false, false);
  const int64_t n = models::CountStageParameters(fp32.model, {}, 0).dense;
  const at::Device cpu(at::kCPU), gpu(at::kCUDA, 1);
  KEEL_EXPECT_OK(CheckModelStateFits(fp32, layout, {cpu, 16 * n, 16 * n}));
  KEEL_EXPECT_OK(CheckModelStateFits(fp32, layout, {cpu, 0, 0}));  // unknown: not checked
  EXPECT_THAT(CheckModelStateFits(fp32, layout, {cpu, 16 * n - 1, 0}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("one rank's weights, gradients and optimizer state take"),
                             HasSubstr(absl::StrCat("(", n, " parameters;")),
                             HasSubstr("but this machine (RAM and swap) holds 0.0 GiB"),
                             HasSubstr("distributed.tensor_model_parallel_size"))));
  EXPECT_THAT(CheckModelStateFits(fp32, layout, {gpu, 16 * n - 1, 16 * n}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("but cuda:1 holds")));

  const TrainOptions bf16 = Options(true, false);  // 18 bytes a parameter on the device
  KEEL_EXPECT_OK(CheckModelStateFits(bf16, layout, {gpu, 18 * n, 4 * n}));
  EXPECT_THAT(CheckModelStateFits(bf16, layout, {gpu, 18 * n, 4 * n - 1}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("weights, built in float32 on the CPU before they go to the "
                                 "device, take")));
  EXPECT_THAT(CheckModelStateFits(bf16, layout, {gpu, 18 * n - 1, 0}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cuda:1")));

  TrainOptions lora = bf16;  // the frozen bf16 weights only
  lora.peft.emplace();
  KEEL_EXPECT_OK(CheckModelStateFits(lora, layout, {gpu, 2 * n, 4 * n}));
  EXPECT_THAT(
      CheckModelStateFits(lora, layout, {gpu, 2 * n - 1, 4 * n}),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("one rank's frozen weights take")));
}

// The ranks of one machine share its memory, and its CPU as their device; each GPU is its rank's.
TEST(MemoryTest, TheRanksOfAMachineShareIt) {
  const parallel::MeshLayout layout = *parallel::MeshLayout::Create({}, 4);
  const TrainOptions fp32 = Options(false, false);
  const int64_t n = models::CountStageParameters(fp32.model, {}, 0).dense;
  const int64_t t = EstimateRankMemory(fp32, layout).total_bytes();  // 20 n: with buckets
  const at::Device cpu(at::kCPU), gpu(at::kCUDA, 1);
  KEEL_EXPECT_OK(CheckModelStateFits(fp32, layout, {cpu, 4 * t, 0, 4}));
  EXPECT_THAT(CheckModelStateFits(fp32, layout, {cpu, 4 * t - 4, 0, 4}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("for each of its 4 ranks"),
                             HasSubstr("or fewer ranks on this machine"))));
  KEEL_EXPECT_OK(CheckModelStateFits(fp32, layout, {gpu, t, 4 * 4 * n, 4}));
  EXPECT_THAT(CheckModelStateFits(fp32, layout, {gpu, t, 4 * 4 * n - 4, 4}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("built in float32 on the CPU before they go to the device")));
  // The same figures for one rank alone pass.
  KEEL_EXPECT_OK(CheckModelStateFits(fp32, layout, {cpu, 4 * t - 4, 0, 1}));
}

// Llama 3.2 1B in bf16 at AutoModel's published shape (8 x 2048 tokens a micro-batch): full
// recomputation keeps each layer's input alone, the chunked loss (the default at its vocabulary)
// a chunk's logits; under 1F1B the first of 4 stages holds 4 micro-batches.
TEST(MemoryTest, ActivationsFollowRecomputationTheLossAndThePipeline) {
  TrainOptions options;
  models::ModelOptions& model = options.model;
  model.family = models::ModelFamily::kLlama;
  model.hidden_size = 2048;
  model.num_layers = 16;
  model.num_attention_heads = 32;
  model.num_query_groups = 8;
  model.ffn_hidden_size = 8192;
  model.vocab_size = 128256;
  options.bf16 = true;
  options.local_batch_size = 8;
  options.step_scheduler.global_batch_size = 8;
  options.data.dataset.sequence_length = 2048;
  const parallel::MeshLayout one = *parallel::MeshLayout::Create({}, 1);
  const RankActivations chunked = EstimateRankActivations(options, one);
  EXPECT_EQ(models::CrossEntropyChunkLen(model), models::kDefaultCrossEntropyChunkLen);
  model.cross_entropy_chunk_len = 0;
  const RankActivations whole = EstimateRankActivations(options, one);
  const int64_t tokens = 8 * 2048, vocab = 128256;  // a multiple of 128
  // Kept: float32 log-probabilities against two float32 numbers a position; at the peak, the
  // bf16 gradient of the whole logits against a chunk's float32 logits, exponentials and bf16
  // gradient.
  EXPECT_EQ(whole.peak_bytes() - chunked.peak_bytes(),
            (4 * tokens * vocab - 8 * tokens) + (2 * tokens - 1024 * 10) * vocab);
  model.recompute.recompute_granularity = parallel::RecomputeGranularity::kFull;
  model.recompute.recompute_method = parallel::RecomputeMethod::kUniform;
  model.recompute.recompute_num_layers = 1;
  const RankActivations full = EstimateRankActivations(options, one);
  EXPECT_EQ(full.memory.kept_bytes, 16 * 2 * tokens * 2048);
  EXPECT_LT(full.memory.kept_bytes, whole.memory.kept_bytes * 6 / 100);
  std::ostringstream out;
  PrintPrecisionAndMemory(options, one, out);
  // A layer made again: 2 RMSNorms' float32 input, normalised values and output (8 bytes a
  // value each), q, k, v (grouped: 2048 + 2 x 512), the attention's output and o_proj's input,
  // SwiGLU's gate, up and product, 3 x 8192: 16,384 x (2 x 8 x 2048 + 2 x (3 x 2048 + 2 x 512 +
  // 3 x 8192)) bytes.
  EXPECT_THAT(out.str(), HasSubstr("with full recomputation (uniform, 1 layer(s)) the stage keeps "
                                   "1024.0 MiB (1504.0 MiB made again at once)"));
  EXPECT_THAT(out.str(), HasSubstr("(whole); 1 micro-batch(es) in flight"));
  // On GPUs (NCCL) LibTorch's fused RMSNorm keeps the bf16 input, not a float32 copy: 6 bytes a
  // value each, not 8: 16,384 x (2 x 6 x 2048 + 2 x (3 x 2048 + 2 x 512 + 3 x 8192)) bytes.
  options.distributed.backend = parallel::Backend::kNccl;
  std::ostringstream on_gpus;
  PrintPrecisionAndMemory(options, one, on_gpus);
  EXPECT_THAT(on_gpus.str(), HasSubstr("a layer keeps 1376.0 MiB a micro-batch"));
  options.distributed.backend = parallel::Backend::kGloo;

  // The default chunked loss: the first stage's 4 micro-batches hold the most.
  model.cross_entropy_chunk_len.reset();
  options.step_scheduler.global_batch_size = 64;
  options.distributed.parallel.pipeline_model_parallel_size = 4;
  const RankActivations piped = EstimateRankActivations(
      options, *parallel::MeshLayout::Create(options.distributed.parallel, 4));
  EXPECT_EQ(piped.stage, 0);
  EXPECT_EQ(piped.micro_batches_in_flight, 4);
  EXPECT_EQ(piped.memory.kept_bytes, 4 * 2 * tokens * 2048);
}

}  // namespace
}  // namespace keel::tools::recipe
