#include "tools/recipe/config.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model_options.h"
#include "optim/param_scheduler.h"
#include "sampling/fixed_window_dataset.h"
#include "sampling/megatron_sampler.h"
#include "scheduling/step_scheduler.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/options.h"

ABSL_FLAG(std::string, config, "", "Path of tools/recipe/default.textproto.");

namespace keel::tools::recipe {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(keel::testing::NewTempDir("config"), "/", name);
  keel::testing::WriteFileOrFail(path, text);
  return path;
}

// A user's file over the defaults sets what it names and keeps every other default (a partial
// file once left sequence_length 0 and the peak learning rate 0); a list it sets replaces the
// default's.
TEST(TrainConfigTest, AFileOverTheDefaultsSetsOnlyWhatItNames) {
  KEEL_ASSERT_OK_AND_ASSIGN(const TrainConfig defaults,
                            LoadTrainConfig(absl::GetFlag(FLAGS_config), {}));
  const std::string partial =
      WriteConfig("partial.textproto",
                  "model { num_layers: 2 }\nstep_scheduler { preemption_signal: \"SIGUSR1\" }\n");
  KEEL_ASSERT_OK_AND_ASSIGN(const TrainConfig config, LoadTrainConfig(partial, {}, defaults));
  EXPECT_EQ(config.model().num_layers(), 2);
  EXPECT_EQ(config.data().sequence_length(), 128);
  EXPECT_EQ(config.optimizer().lr(), 0.003);
  EXPECT_EQ(config.lr_scheduler().min_lr(), 0.0003);
  EXPECT_EQ(config.model().hidden_size(), defaults.model().hidden_size());
  EXPECT_THAT(config.step_scheduler().preemption_signal(), ElementsAre("SIGUSR1"));
  KEEL_ASSERT_OK_AND_ASSIGN(const TrainConfig alone, LoadTrainConfig(partial, {}));
  EXPECT_EQ(alone.data().sequence_length(), 0);  // without a base: the file alone
}

TEST(TrainConfigTest, DefaultConfigFillsEveryOptionsStruct) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainConfig config, LoadTrainConfig(absl::GetFlag(FLAGS_config), {}));
  scheduling::StepSchedulerOptions step;
  EXPECT_THAT(CopyFields(config.step_scheduler(), step), IsOk());
  EXPECT_EQ(step.global_batch_size, 16);  // values as written in default.textproto
  EXPECT_EQ(step.max_steps, 200);
  sampling::FixedWindowDatasetOptions data;
  EXPECT_THAT(CopyFields(config.data(), data), IsOk());
  EXPECT_EQ(data.sequence_length, 128);
  sampling::MegatronSamplerOptions sampler;
  EXPECT_THAT(CopyFields(config.sampler(), sampler, {"micro_batch_size", "global_batch_size"}),
              IsOk());
  EXPECT_EQ(sampler.dataloader_type, sampling::DataloaderType::kCyclic);
  models::ModelOptions model;
  EXPECT_THAT(CopyFields(config.model(), model), IsOk());
  EXPECT_EQ(model.num_layers, 4);
  optim::ParamSchedulerOptions lr;
  EXPECT_THAT(CopyFields(config.lr_scheduler(), lr), IsOk());
  EXPECT_EQ(lr.lr_decay_style, optim::LrDecayStyle::kCosine);
  EXPECT_EQ(lr.min_lr, 0.0003);
  checkpoint::CheckpointerOptions checkpoint;
  EXPECT_THAT(CopyFields(config.checkpoint(), checkpoint), IsOk());
  EXPECT_TRUE(checkpoint.is_async);
  EXPECT_EQ(checkpoint.keep_last_k, 2);
}

// An empty section copies nothing, so every field keeps the reference default; and CopyFields
// visits every field of the struct, so an OK status proves the schema has each of them.
TEST(TrainConfigTest, SchemaHasEveryOptionsFieldAndUnsetFieldsKeepDefaults) {
  const TrainConfig empty;
  scheduling::StepSchedulerOptions step;
  EXPECT_THAT(CopyFields(empty.step_scheduler(), step), IsOk());
  EXPECT_EQ(step.global_batch_size, scheduling::StepSchedulerOptions().global_batch_size);
  EXPECT_EQ(step.num_epochs, scheduling::StepSchedulerOptions().num_epochs);
  EXPECT_EQ(step.preemption_signal, scheduling::StepSchedulerOptions().preemption_signal);
  sampling::FixedWindowDatasetOptions data;
  EXPECT_THAT(CopyFields(empty.data(), data), IsOk());
  MegatronDataOptions megatron;
  EXPECT_THAT(CopyFields(empty.data(), megatron), IsOk());
  EXPECT_EQ(megatron.split, "900,50,50");  // NeMo's
  EXPECT_EQ(megatron.seed, 1234);
  sampling::MegatronSamplerOptions sampler;
  EXPECT_THAT(CopyFields(empty.sampler(), sampler, {"micro_batch_size", "global_batch_size"}),
              IsOk());
  EXPECT_EQ(sampler.dataloader_type, sampling::MegatronSamplerOptions().dataloader_type);
  models::ModelOptions model;
  EXPECT_THAT(CopyFields(empty.model(), model), IsOk());
  optim::ParamSchedulerOptions lr;
  EXPECT_THAT(CopyFields(empty.lr_scheduler(), lr), IsOk());
  EXPECT_EQ(lr.lr_decay_style, optim::ParamSchedulerOptions().lr_decay_style);
  checkpoint::CheckpointerOptions checkpoint;
  EXPECT_THAT(CopyFields(empty.checkpoint(), checkpoint), IsOk());
  EXPECT_EQ(checkpoint.keep_last_k, checkpoint::CheckpointerOptions().keep_last_k);
}

TEST(TrainConfigTest, SectionLackingAFieldIsAnInternalError) {
  scheduling::StepSchedulerOptions step;
  EXPECT_THAT(
      CopyFields(ModelConfig(), step),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("has no int64 field \"global_batch_size\"")));
  // An optional field the schema lacks is caught too, set or not.
  optim::ParamSchedulerOptions lr;
  EXPECT_THAT(
      CopyFields(ModelConfig(), lr),
      StatusIs(absl::StatusCode::kInternal, HasSubstr("keel.tools.recipe.ModelConfig has no")));
}

TEST(TrainConfigTest, OverridesSetScalarsStringsAndLists) {
  TrainConfig config;
  EXPECT_THAT(ApplyOverride("step_scheduler.max_steps=12", config), IsOk());
  EXPECT_THAT(ApplyOverride("lr_scheduler.max_lr=2.5e-4", config), IsOk());
  EXPECT_THAT(ApplyOverride("lr_scheduler.lr_decay_style=inverse-square-root", config), IsOk());
  EXPECT_THAT(ApplyOverride("sampler.dataloader_type=\"single\"", config), IsOk());
  EXPECT_THAT(ApplyOverride("checkpoint.is_async=false", config), IsOk());
  EXPECT_THAT(ApplyOverride("run_dir=runs/a,b", config), IsOk());
  EXPECT_THAT(ApplyOverride("step_scheduler.preemption_signal=SIGTERM,SIGUSR1", config), IsOk());
  EXPECT_EQ(config.step_scheduler().max_steps(), 12);
  EXPECT_EQ(config.lr_scheduler().max_lr(), 2.5e-4);
  EXPECT_EQ(config.lr_scheduler().lr_decay_style(), "inverse-square-root");
  EXPECT_EQ(config.sampler().dataloader_type(), "single");
  EXPECT_TRUE(config.checkpoint().has_is_async());
  EXPECT_FALSE(config.checkpoint().is_async());
  EXPECT_EQ(config.run_dir(), "runs/a,b");  // a scalar string keeps its commas
  EXPECT_THAT(config.step_scheduler().preemption_signal(), ElementsAre("SIGTERM", "SIGUSR1"));
  // A later override of a list replaces it.
  EXPECT_THAT(ApplyOverride("step_scheduler.preemption_signal=SIGINT", config), IsOk());
  EXPECT_THAT(config.step_scheduler().preemption_signal(), ElementsAre("SIGINT"));
}

TEST(TrainConfigTest, BadOverridesNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"step_scheduler.max_steps", "must be section.field=value"},
      {"trainer.max_steps=3", "no field \"trainer\" in the config; fields: run_dir, seed,"},
      {"model.layers=3", "no field \"layers\" in section model; fields: vocab_size, hidden_size,"},
      {"model=3", "model is a section; set one of its fields: vocab_size"},
      {"run_dir.x=3", "run_dir is not a section"},
      {"step_scheduler.max_steps=ten", "\"ten\" is not a valid int64 for step_scheduler.max_steps"},
      {"checkpoint.is_async=maybe", "\"maybe\" is not a valid bool"},
  };
  for (const auto& [assignment, message] : cases) {
    SCOPED_TRACE(assignment);
    TrainConfig config;
    EXPECT_THAT(ApplyOverride(assignment, config),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

TEST(TrainConfigTest, BadEnumSpellingNamesSectionFieldAndAllowedValues) {
  TrainConfig config;
  ASSERT_THAT(ApplyOverride("lr_scheduler.lr_decay_style=sine", config), IsOk());
  optim::ParamSchedulerOptions lr;
  EXPECT_THAT(
      CopyFields(config.lr_scheduler(), lr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lr_scheduler.lr_decay_style: ")));
  EXPECT_THAT(CopyFields(config.lr_scheduler(), lr).message(), HasSubstr("cosine"));
}

TEST(TrainConfigTest, LoadErrorsNameFileLineAndField) {
  EXPECT_THAT(LoadTrainConfig("/nonexistent/train.textproto", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/train.textproto")));
  const std::string unknown = WriteConfig("unknown.textproto", "model {\n  layers: 3\n}\n");
  EXPECT_THAT(LoadTrainConfig(unknown, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat(unknown, ": line 2, column "))));
  EXPECT_THAT(LoadTrainConfig(unknown, {}).status().message(), HasSubstr("layers"));
  const std::string syntax = WriteConfig("syntax.textproto", "seed: 3\nmodel {\n");
  EXPECT_THAT(LoadTrainConfig(syntax, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 3")));
  // Bytes that are no text (a binary file given as the config) are named escaped.
  const std::string binary = WriteConfig("binary.textproto", "\xc3\x1b[2J\x01");
  EXPECT_THAT(
      LoadTrainConfig(binary, {}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("line 1, column 1: "), HasSubstr("\\xc3"), Not(HasSubstr("\x1b")))));
  const std::string good = WriteConfig("good.textproto", "seed: 3\n");
  EXPECT_THAT(LoadTrainConfig(good, {"seed=x"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seed=x")));
  KEEL_ASSERT_OK_AND_ASSIGN(TrainConfig config, LoadTrainConfig(good, {"seed=5", "seed=6"}));
  EXPECT_EQ(config.seed(), 6);  // overrides apply in order, after the file
}

}  // namespace
}  // namespace keel::tools::recipe
