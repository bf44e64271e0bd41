// The trainer's data.paths: Megatron's datasets sized by the run, their errors before
// training, loss masks counted per label, and a resume with new blend weights that
// continues every dataset where it stopped.
#include "tools/recipe/megatron_data.h"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "checkpoint/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sampling/indexed_dataset_writer.h"
#include "sampling/resumable_blend.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/run.h"

namespace keel::tools::recipe {
namespace {

using ::absl::StatusCode;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Datasets "a" and "b" of 200 documents of 20 to 59 byte tokens (below 256).
const std::string& DataDir() {
  static const std::string* const dir = [] {
    auto* path = new std::string(keel::testing::NewTempDir("megatron_data"));
    for (const char* name : {"a", "b"}) {
      auto writer =
          sampling::IndexedDatasetWriter::Create(*path + "/" + name, sampling::TokenDtype::kUint16);
      EXPECT_TRUE(writer.ok());
      for (int64_t d = 0; d < 200; ++d) {
        std::vector<int64_t> tokens;
        for (int64_t j = 0; j < 20 + (d * 13) % 40; ++j) tokens.push_back((d * 31 + j) % 250 + 1);
        EXPECT_TRUE(writer->AddDocument(tokens, {static_cast<int64_t>(tokens.size())}).ok());
      }
      EXPECT_TRUE(writer->Finalize().ok());
    }
    return path;
  }();
  return *dir;
}

// One layer of width 32 over 16-token samples, 4 samples a step in micro-batches of 2, a
// synchronous checkpoint every 2 steps, validation every 2.
TrainOptions Options(const std::string& run_dir, const std::string& paths, int64_t max_steps) {
  TrainOptions options;
  options.run_dir = run_dir;
  options.seed = 7;
  options.step_scheduler.global_batch_size = 4;
  options.step_scheduler.max_steps = max_steps;
  options.step_scheduler.ckpt_every_steps = 2;
  options.step_scheduler.val_every_steps = 2;
  options.step_scheduler.preemption_signal = std::nullopt;
  options.local_batch_size = 2;
  options.data.megatron.paths = paths;
  options.data.megatron.index_mapping_dir = run_dir + "/index_cache";
  options.data.dataset.sequence_length = 16;
  options.sampler.micro_batch_size = 2;
  options.sampler.global_batch_size = 4;
  options.sampler.dataloader_type = sampling::DataloaderType::kSingle;
  options.model.hidden_size = 32;
  options.model.num_layers = 1;
  options.model.num_attention_heads = 2;
  options.model.ffn_hidden_size = 64;
  options.model.max_sequence_length = 16;
  options.lr_scheduler.max_lr = 1e-3;
  options.lr_scheduler.lr_decay_steps = 100;
  options.checkpoint.checkpoint_dir = run_dir + "/checkpoints";
  options.logging.tensorboard = false;
  return options;
}

std::string Paths(double wa, double wb) {
  return absl::StrCat(wa, " ", DataDir(), "/a ", wb, " ", DataDir(), "/b");
}

TrainRuntime Runtime(std::ostream& log) {
  TrainRuntime runtime;
  runtime.log = &log;
  return runtime;
}

TEST(MegatronDataTest, SplitsAreSizedByTheRun) {
  const std::string dir = keel::testing::NewTempDir("sizes");
  std::ostringstream log;
  TrainOptions options = Options(dir, Paths(0.3, 0.7), 10);
  // Training: 10 steps x 4 = 40 samples, blended from ceil(40 * 0.3) = 12 and 28 (Megatron's
  // targets); validation: 10 / 2 validations x 4 = 20.
  EXPECT_EQ(MegatronSizes(options)[0], 40);
  EXPECT_EQ(MegatronSizes(options)[1], 20);
  KEEL_ASSERT_OK_AND_ASSIGN(auto data, MegatronData::Open(options, Runtime(log), false));
  EXPECT_EQ(data->train_size(), 40);
  EXPECT_EQ(data->val_size(), 20);
  std::ostringstream described;
  data->Describe(described);
  EXPECT_THAT(described.str(), AllOf(HasSubstr("train: 40 samples (blend)"),
                                     HasSubstr("/a: weight 0.3, 12 samples drawn, 1 epoch(s)"),
                                     HasSubstr("/b: weight 0.7, 28 samples drawn, 1 epoch(s)"),
                                     HasSubstr("validation: 20 samples")));
  std::vector<int64_t> tokens;
  KEEL_ASSERT_OK_AND_ASSIGN(SampleSource source, data->Window(0, false, tokens));
  EXPECT_EQ(tokens.size(), 17u);                // sequence_length + 1
  EXPECT_EQ(source.dataset, DataDir() + "/b");  // 0.7 > 0.3 at position 0
  EXPECT_EQ(source.dataset_sample, 0);
}

TEST(MegatronDataTest, BadDataIsRefusedBeforeTraining) {
  const std::string dir = keel::testing::NewTempDir("errors");
  struct Case {
    const char* name;
    void (*change)(TrainOptions&);
    const char* message;
  };
  const Case cases[] = {
      {"missing prefix", [](TrainOptions& o) { o.data.megatron.paths = DataDir() + "/nope"; },
       "/nope\", which is not an indexed dataset"},
      {"sequence longer than the data",
       [](TrainOptions& o) { o.data.dataset.sequence_length = 100000; },
       "data.sequence_length (100000) is longer than the training documents of"},
      {"token above the vocabulary", [](TrainOptions& o) { o.model.vocab_size = 100; },
       "is outside [0, model.vocab_size = 100)"},
      {"a split with no document asked for samples",
       [](TrainOptions& o) { o.data.megatron.split = "1000,1,0"; }, "the valid split of"},
      {"no training documents", [](TrainOptions& o) { o.data.megatron.split = "0,1,0"; },
       "gives training no documents"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::ostringstream log;
    TrainOptions options = Options(dir, Paths(0.3, 0.7), 10);
    c.change(options);
    EXPECT_THAT(MegatronData::Open(options, Runtime(log), false),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

// Without the extra token each sample's last label is the pad id: masked, not counted.
TEST(MegatronDataTest, MaskedLabelsAreNotCounted) {
  const std::string dir = keel::testing::NewTempDir("masks");
  std::ostringstream log;
  TrainOptions options = Options(dir, Paths(0.3, 0.7), 4);
  options.data.dataset.add_extra_token_to_sequence = false;
  KEEL_ASSERT_OK_AND_ASSIGN(auto whole, Run::Build(options, Runtime(log)));
  options.run_dir = dir + "/split";
  KEEL_ASSERT_OK_AND_ASSIGN(auto split, Run::Build(options, Runtime(log)));
  KEEL_ASSERT_OK_AND_ASSIGN(StepOutput one, whole->Step({{0, 1}}));
  KEEL_ASSERT_OK_AND_ASSIGN(StepOutput two, split->Step({{0}, {1}}));
  EXPECT_EQ(one.label_tokens, 2 * (16 - 1));
  EXPECT_EQ(two.label_tokens, one.label_tokens);
  // The mean over the counted labels, whatever the micro-batches (float sums reassociate).
  EXPECT_NEAR(two.loss, one.loss, 1e-6 * one.loss);
  EXPECT_NEAR(one.loss, std::log(256.0), 0.3);
}

absl::StatusOr<sampling::BlendState> SavedBlend(const std::string& checkpoint) {
  KEEL_ASSIGN_OR_RETURN(auto reader, checkpoint::CheckpointReader::Open(checkpoint));
  KEEL_ASSIGN_OR_RETURN(base::Json values, reader->ReadValues("data"));
  sampling::BlendState state;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(values, state));
  return state;
}

TEST(MegatronDataTest, ResumeWithNewWeightsContinuesEveryDatasetWhereItStopped) {
  const std::string dir = keel::testing::NewTempDir("reweight");
  std::ostringstream first_log, second_log;
  KEEL_ASSERT_OK(Train(Options(dir, Paths(0.3, 0.7), 4), Runtime(first_log)).status());
  KEEL_ASSERT_OK_AND_ASSIGN(sampling::BlendState first,
                            SavedBlend(dir + "/checkpoints/step_0000000004"));
  // 16 samples by Megatron's greedy at 0.3 / 0.7: 5 of a (within one of 4.8), 11 of b.
  EXPECT_EQ(first.consumed_samples, 16);
  EXPECT_EQ(first.dataset_consumed, (std::vector<int64_t>{5, 11}));

  KEEL_ASSERT_OK(Train(Options(dir, Paths(0.8, 0.2), 8), Runtime(second_log)).status());
  EXPECT_THAT(second_log.str(),
              AllOf(HasSubstr("warning: data: the blend was \"0.3 "), HasSubstr("it is \"0.8 "),
                    HasSubstr("from sample 16 on"),
                    HasSubstr("continues its stream where it stopped, after 5, 11 samples")));
  KEEL_ASSERT_OK_AND_ASSIGN(sampling::BlendState second,
                            SavedBlend(dir + "/checkpoints/step_0000000008"));
  // The 16 samples after the resume go 0.8 / 0.2 (within one: 13 and 3), each dataset going
  // on from its count at the resume.
  EXPECT_EQ(second.consumed_samples, 32);
  EXPECT_EQ(second.segment_start, 16);
  EXPECT_EQ(second.segment_base, first.dataset_consumed);
  EXPECT_EQ(second.dataset_consumed, (std::vector<int64_t>{5 + 13, 11 + 3}));
}

}  // namespace
}  // namespace keel::tools::recipe
