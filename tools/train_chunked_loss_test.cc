// //tools:train with the output layer and the loss over chunks of positions (loss_fn.chunk_len),
// as child processes: the loss, gradient-norm and validation trace follows the run with the
// micro-batch's logits whole within float rounding for both families (the Llama fixture's
// vocabulary padded, its output layer tied and untied), at tp=2 (each rank's vocabulary slice)
// and pp=2; an adapted output layer (LoRA on lm_head) keeps its whole logits; a negative length
// is refused by name.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/files.h"
#include "tools/cli/subprocess_testutil.h"
#include "tools/train_testutil.h"

namespace keel::tools {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::tools::cli::Subprocess;
using ::keel::tools::cli::With;

// `common` (6 steps, validating every 3) on `ranks` ranks with the logits whole, then in chunks
// of 7 positions (dividing no micro-batch); returns both run directories.
std::pair<std::string, std::string> RunWholeAndChunked(int ranks,
                                                       const std::vector<std::string>& common) {
  std::vector<std::string> dirs;
  for (const char* chunk_len : {"loss_fn.chunk_len=0", "loss_fn.chunk_len=7"}) {
    const std::string dir = NewTempDir("chunked");
    const std::vector<std::string> args =
        SameSamplesRun(dir, 6, With(common, {"step_scheduler.val_every_steps=3", chunk_len}));
    Subprocess run =
        ranks == 1 ? StartTrain(args, dir + "/stderr") : LaunchTrain(ranks, args, dir + "/stderr");
    EXPECT_EQ(run.Wait(), 0) << run.Stderr();
    dirs.push_back(dir);
  }
  return {dirs[0], dirs[1]};
}

void ExpectChunkingChangesOnlyRounding(int ranks, const std::vector<std::string>& common) {
  const auto [whole, chunked] = RunWholeAndChunked(ranks, common);
  ExpectCloseTrace(Metrics(whole), Metrics(chunked), 1e-6, 1e-5);
}

TEST(TrainChunkedLossTest, TheGptTraceIsTheWholeLogitsTrace) {
  ExpectChunkingChangesOnlyRounding(1, {});
}

TEST(TrainChunkedLossTest, TheLlamaTracesAreTheWholeLogitsTraces) {
  for (const char* name : {"llama_tied", "llama_gqa_untied"}) {
    SCOPED_TRACE(name);
    ExpectChunkingChangesOnlyRounding(1, PretrainedRun(name));
  }
}

TEST(TrainChunkedLossTest, TensorAndPipelineParallelTracesAreTheWholeLogitsTraces) {
  for (const char* layout :
       {"distributed.tensor_model_parallel_size=2", "distributed.pipeline_model_parallel_size=2"}) {
    SCOPED_TRACE(layout);
    ExpectChunkingChangesOnlyRounding(2, With(PretrainedRun("llama_gqa_untied"), {layout}));
  }
}

// LoRA on every linear layer, lm_head among them: the adapted output layer's logits stay whole,
// so chunk_len changes nothing.
TEST(TrainChunkedLossTest, AnAdaptedOutputLayerKeepsItsWholeLogits) {
  const auto [whole, chunked] = RunWholeAndChunked(
      1, With(PretrainedRun("llama_gqa_untied"), {"peft.dim=4", "peft.match_all_linear=true"}));
  ExpectSameTrace(Metrics(whole), Metrics(chunked));
}

TEST(TrainChunkedLossTest, ANegativeLengthIsRefused) {
  ExpectRefused(1, {"loss_fn.chunk_len=-1"},
                "loss_fn.chunk_len (-1) must be >= 0 (0: the logits whole)",
                NewTempDir("refused") + "/negative");
}

}  // namespace
}  // namespace keel::tools
