#include "tools/recipe/options.h"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/config.h"

ABSL_FLAG(std::string, config, "", "Path of tools/recipe/default.textproto.");

namespace keel::tools::recipe {
namespace {

using ::keel::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

absl::StatusOr<TrainOptions> Read(const std::vector<std::string>& overrides) {
  KEEL_ASSIGN_OR_RETURN(TrainConfig config,
                        LoadTrainConfig(absl::GetFlag(FLAGS_config), overrides));
  return ReadOptions(config);
}

TEST(ReadOptionsTest, DefaultConfigFillsEveryOption) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({}));
  // Values as written in default.textproto.
  EXPECT_EQ(options.run_dir, "runs/default");
  EXPECT_EQ(options.seed, 1234);
  EXPECT_EQ(options.step_scheduler.global_batch_size, 16);
  EXPECT_EQ(options.local_batch_size, 8);
  EXPECT_EQ(options.sampler.micro_batch_size, 8);  // from step_scheduler
  EXPECT_EQ(options.sampler.global_batch_size, 16);
  EXPECT_EQ(options.data.validation_every_n_samples, 20);  // unset there: the default
  EXPECT_EQ(options.model.max_sequence_length, 128);       // data.sequence_length
  EXPECT_EQ(options.optimizer.beta2, 0.95);
  EXPECT_EQ(options.lr_scheduler.lr_decay_style, optim::LrDecayStyle::kCosine);
  EXPECT_EQ(options.max_norm, 1.0);
  EXPECT_EQ(options.checkpoint.checkpoint_dir, "runs/default/checkpoints");
  EXPECT_TRUE(options.checkpoint.is_async);
  EXPECT_EQ(options.distributed.backend, parallel::Backend::kGloo);
  EXPECT_EQ(options.logging.log_every_steps, 10);
}

// optimizer.lr is the peak, as Megatron's --lr and AutoModel's optimizer lr are, unless
// lr_scheduler.max_lr says otherwise (it was once ignored for the default's max_lr).
TEST(ReadOptionsTest, OptimizerLrIsThePeakUnlessMaxLrIsSet) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({"optimizer.lr=0.01"}));
  EXPECT_EQ(options.lr_scheduler.max_lr, 0.01);
  EXPECT_EQ(options.lr_scheduler.min_lr, 0.0003);  // set in default.textproto
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"optimizer.lr=0.01", "lr_scheduler.max_lr=0.002"}));
  EXPECT_EQ(options.lr_scheduler.max_lr, 0.002);
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({}));
  EXPECT_EQ(options.lr_scheduler.max_lr, 0.003);  // default.textproto's optimizer.lr
  EXPECT_FALSE(options.derived_lr_steps.lr_decay_steps);
}

// Any peft field turns LoRA on with AutoModel's defaults for the others; a list takes commas.
TEST(ReadOptionsTest, APeftFieldTurnsLoraOn) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({}));
  EXPECT_FALSE(options.peft.has_value());
  KEEL_ASSERT_OK_AND_ASSIGN(options,
                            Read({"peft.dim=16", "peft.target_modules=*.q_proj,*.v_proj"}));
  ASSERT_TRUE(options.peft.has_value());
  EXPECT_EQ(options.peft->dim, 16);
  EXPECT_EQ(options.peft->alpha, 32);
  EXPECT_EQ(options.peft->dropout_position, peft::DropoutPosition::kPost);
  EXPECT_EQ(options.peft->target_modules, (std::vector<std::string>{"*.q_proj", "*.v_proj"}));
  EXPECT_THAT(Read({"peft.dim=0"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peft.dim (0)")));
  EXPECT_THAT(Read({"peft.dropout_position=middle"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("peft.dropout_position"), HasSubstr("\"post\", \"pre\""))));
  EXPECT_THAT(Read({"peft.match_all_linear=true", "peft.exclude_modules=lm_head"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("peft.match_all_linear (true) selects every linear layer")));
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"peft.lora_dtype=float32"}));
  EXPECT_EQ(options.peft->lora_dtype, peft::LoraDtype::kFloat32);
  KEEL_ASSERT_OK(Read({"peft.dim=4", "model.num_moe_experts=4"}).status());  // experts frozen
  EXPECT_THAT(Read({"peft.lora_dtype=float16"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("peft.lora_dtype"),
                             HasSubstr("\"base\", \"float32\", \"bfloat16\""))));
}

TEST(ReadOptionsTest, UnsetSectionsKeepTheDefaults) {
  TrainConfig config;
  config.set_run_dir("r");
  config.mutable_step_scheduler()->set_local_batch_size(2);
  config.mutable_data()->set_sequence_length(128);  // required: Megatron's seq_length
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, ReadOptions(config));
  EXPECT_EQ(options.optimizer.lr, 1e-3);  // torch::optim::AdamW's defaults
  EXPECT_EQ(options.optimizer.weight_decay, 1e-2);
  EXPECT_EQ(options.max_norm, std::numeric_limits<double>::infinity());
  EXPECT_EQ(options.distributed.timeout_seconds, 600);
  EXPECT_TRUE(options.logging.tensorboard);
  EXPECT_TRUE(options.numerics.check_for_nan_in_loss_and_grad);  // Megatron's default
  EXPECT_EQ(options.numerics.on_nonfinite, NonFinitePolicy::kStop);
  EXPECT_EQ(options.step_scheduler.num_epochs,
            scheduling::StepSchedulerOptions().num_epochs);  // NeMo's default
  // The trainer's own default; the library's is kReference.
  EXPECT_EQ(options.lr_scheduler.load_policy, optim::SchedulerLoadPolicy::kCorrected);
  config.mutable_lr_scheduler()->set_load_policy("reference");
  KEEL_ASSERT_OK_AND_ASSIGN(options, ReadOptions(config));
  EXPECT_EQ(options.lr_scheduler.load_policy, optim::SchedulerLoadPolicy::kReference);
}

// Every configuration error a user can make is found before anything is built, as
// kInvalidArgument naming the field and the value.
TEST(ReadOptionsTest, BadConfigsNameTheProblem) {
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"model.layers=3"}, "no field \"layers\" in section model"},
      {{"lr_scheduler.lr_decay_style=sine"}, "lr_scheduler.lr_decay_style"},
      {{"lr_scheduler.load_policy=megatron"}, "lr_scheduler.load_policy"},
      {{"sampler.dataloader_type=shuffled"}, "sampler.dataloader_type"},
      {{"checkpoint.model_save_format=pickle"}, "checkpoint.model_save_format"},
      {{"step_scheduler.local_batch_size=0"}, "step_scheduler.local_batch_size (0) must be > 0"},
      {{"model.hidden_size=30"},
       "model.hidden_size (30) must be divisible by model.num_attention_heads (4)"},
      {{"model.num_layers=0"}, "model.num_layers (0) must be > 0"},
      {{"model.vocab_size=-1"}, "model.vocab_size (-1) must be > 0"},
      {{"data.validation_every_n_samples=1"},
       "data.validation_every_n_samples (1) must be 0 (no validation) or >= 2"},
      {{"optimizer.name=SGD"}, "optimizer.name \"SGD\" is not supported"},
      {{"optimizer.lr=-0.1"}, "optimizer.lr (-0.1) must be a finite number >= 0"},
      {{"optimizer.lr=inf"}, "optimizer.lr (inf) must be a finite number >= 0"},
      {{"optimizer.eps=nan"}, "optimizer.eps (nan) must be a finite number >= 0"},
      {{"optimizer.weight_decay=-1"}, "optimizer.weight_decay (-1) must be a finite number >= 0"},
      {{"optimizer.beta1=1.5"}, "optimizer.beta1 (1.5) must be in [0, 1)"},
      {{"optimizer.beta2=1"}, "optimizer.beta2 (1) must be in [0, 1)"},
      {{"lr_scheduler.max_lr=inf"}, "lr_scheduler.max_lr (inf) must be finite"},
      {{"lr_scheduler.end_wd=inf"}, "lr_scheduler.end_wd (inf) must be finite"},
      {{"distributed.backend=mpi"}, "distributed.backend \"mpi\" is not one of \"gloo\", \"nccl\""},
      {{"distributed.timeout_seconds=0"}, "distributed.timeout_seconds (0) must be > 0"},
      {{"distributed.hang_timeout_seconds=-1"},
       "distributed.hang_timeout_seconds (-1) must be >= 0 (0: off)"},
      {{"logging.log_every_steps=0"}, "logging.log_every_steps (0) must be > 0"},
      {{"distributed.pipeline_model_parallel_size=3"},
       "distributed.pipeline_model_parallel_size (3) must divide model.num_layers (4): each "
       "stage holds an equal number of layers, at least one; sizes that do: 1, 2, 4"},
      {{"distributed.pipeline_model_parallel_size=8"},
       "distributed.pipeline_model_parallel_size (8) must divide model.num_layers (4)"},
      {{"distributed.pipeline_model_parallel_size=0"},
       "distributed.pipeline_model_parallel_size (0) must be > 0"},
      {{"distributed.tensor_model_parallel_size=3"},
       "distributed.tensor_model_parallel_size (3) must divide model.num_attention_heads (4): "
       "each tensor-parallel rank holds an equal share; sizes that do: 1, 2, 4"},
      {{"distributed.tensor_model_parallel_size=4", "model.ffn_hidden_size=6"},
       "distributed.tensor_model_parallel_size (4) must divide model.ffn_hidden_size (6): each "
       "tensor-parallel rank holds an equal share; sizes that do: 1, 2, 3, 6"},
      {{"distributed.tensor_model_parallel_size=0"},
       "distributed.tensor_model_parallel_size (0) must be > 0"},
      {{"model.make_vocab_size_divisible_by=0"},
       "model.make_vocab_size_divisible_by (0) must be > 0"},
      {{"distributed.expert_model_parallel_size=4"}, "distributed.expert_model_parallel_size (4)"},
      {{"distributed.virtual_pipeline_model_parallel_size=2"},
       "distributed.virtual_pipeline_model_parallel_size (2)"},
      {{"clip_grad.check_norm_every_steps=-1"},
       "clip_grad.check_norm_every_steps (-1) must be >= 0 (0: never)"},
      {{"numerics.on_nonfinite=ignore"},
       "numerics.on_nonfinite: \"ignore\" is not one of \"stop\", \"skip\""},
      // Quoted as a value from a file is: escaped and cut, not echoed whole.
      {{"numerics.on_nonfinite=" + std::string(5000, 'x')},
       "numerics.on_nonfinite: \"" + std::string(199, 'x') +
           "... is not one of \"stop\", \"skip\""},
      {{"numerics.max_consecutive_skipped_steps=0"},
       "numerics.max_consecutive_skipped_steps (0) must be > 0"},
      {{"run_dir="}, "run_dir must be set"},
      {{"model.tf32=true"},
       "model.tf32 (true) applies to GPU runs (distributed.backend \"nccl\"); allowed on the "
       "CPU: false"},
      {{"logging.profile_steps=-1"}, "logging.profile_steps (-1) must be >= 0 (0: no profile)"},
      {{"logging.profile_after_step=-2"}, "logging.profile_after_step (-2) must be >= 0"},
      {{"distributed.grad_reduce_in_fp32=false"},
       "distributed.grad_reduce_in_fp32 (false) applies to model.bf16 runs (float32 runs "
       "reduce float32 gradients); allowed without model.bf16: unset"},
      {{"data.sequence_length=0"},
       "data.sequence_length (0) must be > 1 (the tokens a sample trains on)"},
      {{"data.sequence_length=-3"}, "data.sequence_length (-3) must be > 1"},
      {{"distributed.gradient_accumulation_fusion=true"},
       "distributed.gradient_accumulation_fusion (true) applies to model.bf16 runs, whose main "
       "gradients it fills (float32 runs keep .grad); allowed without model.bf16: unset"},
      {{"distributed.sequence_parallel=true"},
       "distributed.sequence_parallel (true) splits the sequence over the tensor-parallel ranks, "
       "and distributed.tensor_model_parallel_size is 1; allowed: sequence_parallel false, or "
       "tensor_model_parallel_size > 1"},
      {{"distributed.sequence_parallel=true", "distributed.tensor_model_parallel_size=2",
        "data.sequence_length=127"},
       "data.sequence_length (127) must be divisible by distributed.tensor_model_parallel_size "
       "(2) with distributed.sequence_parallel: each tensor-parallel rank holds an equal share "
       "of every sequence; allowed: a multiple of 2, or sequence_parallel false"},
      {{"distributed.sequence_parallel=true", "distributed.tensor_model_parallel_size=2",
        "data.format=sft", "data.prefix=chat", "packed_sequence.packed_sequence_size=63"},
       "packed_sequence.packed_sequence_size (63) must be divisible by "
       "distributed.tensor_model_parallel_size (2)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.overrides, " "));
    EXPECT_THAT(Read(c.overrides),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

// optimizer.fused (torch.optim.AdamW's): unset by default (the trainer picks per device), as
// set otherwise. model.tf32 goes with a GPU backend.
TEST(ReadOptionsTest, PrecisionAndKernelChoices) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({}));
  EXPECT_EQ(options.optimizer.fused, std::nullopt);
  EXPECT_FALSE(options.tf32);
  EXPECT_EQ(options.logging.profile_steps, 0);
  EXPECT_EQ(options.logging.profile_after_step, 5);
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"optimizer.fused=false"}));
  EXPECT_EQ(options.optimizer.fused, false);
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"optimizer.fused=true"}));
  EXPECT_EQ(options.optimizer.fused, true);
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"model.tf32=true", "distributed.backend=nccl"}));
  EXPECT_TRUE(options.tf32);
  EXPECT_EQ(ConfigFingerprint(options)["tf32"], true);
}

// distributed.sequence_parallel (Megatron's): off by default; read, and in the run's fingerprint
// when on (off, the fingerprint is an older Keel's).
TEST(ReadOptionsTest, SequenceParallelIsReadAndFingerprinted) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({}));
  EXPECT_FALSE(options.distributed.sequence_parallel);
  EXPECT_FALSE(ConfigFingerprint(options)["distributed"].contains("sequence_parallel"));
  KEEL_ASSERT_OK_AND_ASSIGN(options, Read({"distributed.sequence_parallel=true",
                                           "distributed.tensor_model_parallel_size=2"}));
  EXPECT_TRUE(options.distributed.sequence_parallel);
  EXPECT_EQ(ConfigFingerprint(options)["distributed"]["sequence_parallel"], true);
}

// What a checkpoint's configuration says of its model: the options a run was read with.
TEST(ReadOptionsTest, SavedModelIsTheRunsModel) {
  KEEL_ASSERT_OK_AND_ASSIGN(
      const TrainOptions options,
      Read({"model.family=qwen3", "model.num_query_groups=2", "model.kv_channels=8",
            "model.rotary_base=500000", "data.sequence_length=48"}));
  KEEL_ASSERT_OK_AND_ASSIGN(const SavedModel saved, ReadSavedModel(ConfigFingerprint(options)));
  EXPECT_EQ(base::WriteJsonFields(saved.options).dump(),
            base::WriteJsonFields(options.model).dump());
  EXPECT_EQ(saved.options.max_sequence_length, 48);
  EXPECT_EQ(saved.pretrained_path, "");
  EXPECT_EQ(saved.padded_vocab_size, 256);
  EXPECT_EQ(saved.model_save_format, checkpoint::SerializationFormat::kKeel);
  base::Json mistyped = ConfigFingerprint(options);
  mistyped["model"]["num_layers"] = "four";
  EXPECT_THAT(ReadSavedModel(mistyped),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.num_layers")));
  EXPECT_THAT(ReadSavedModel(base::Json::object()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no \"model\" section")));
}

// model.bf16 (Megatron's bf16): off by default; distributed.grad_reduce_in_fp32 and
// gradient_accumulation_fusion unset (true under bf16) or as set; on the CPU with model parallelism
// too (Gloo carries bf16).
TEST(ReadOptionsTest, Bf16IsOptIn) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({}));
  EXPECT_FALSE(options.bf16);
  EXPECT_EQ(ConfigFingerprint(options)[kBf16Field], false);
  KEEL_ASSERT_OK_AND_ASSIGN(options,
                            Read({"model.bf16=true", "distributed.grad_reduce_in_fp32=false"}));
  EXPECT_TRUE(options.bf16);
  EXPECT_EQ(options.distributed.grad_reduce_in_fp32, false);
  EXPECT_EQ(ConfigFingerprint(options)[kBf16Field], true);
  EXPECT_EQ(options.distributed.gradient_accumulation_fusion, std::nullopt);
  KEEL_ASSERT_OK_AND_ASSIGN(
      options, Read({"model.bf16=true", "distributed.gradient_accumulation_fusion=false"}));
  EXPECT_EQ(options.distributed.gradient_accumulation_fusion, false);
  const std::vector<std::string> tp2 = {"model.bf16=true",
                                        "distributed.tensor_model_parallel_size=2"};
  KEEL_EXPECT_OK(Read(tp2).status());
}

// data.paths: NeMo's defaults (no validation windows: data.split gives the validation split,
// without a second field to set), and every rule checked before anything opens a dataset.
TEST(ReadOptionsTest, MegatronDataIsCheckedBeforeAnythingIsBuilt) {
  const std::vector<std::string> blend = {"data.paths=0.3 /x/a 0.7 /x/b"};
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read(blend));
  EXPECT_EQ(options.data.validation_every_n_samples, 0);
  EXPECT_EQ(options.data.megatron.paths, "0.3 /x/a 0.7 /x/b");
  EXPECT_EQ(options.data.megatron.split, "900,50,50");
  EXPECT_EQ(options.data.megatron.seed, 1234);
  EXPECT_EQ(options.data.megatron.index_mapping_dir, "");
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"data.prefix=/x/c"},
       "data.paths (\"0.3 /x/a 0.7 /x/b\") and data.prefix (\"/x/c\") are "
       "exclusive"},
      {{"data.validation_every_n_samples=20"},
       "data.validation_every_n_samples (20) must be 0 with data.paths"},
      {{"data.paths=0 /x/a 1 /x/b"}, "data.paths: the weight of /x/a (0) must be a positive"},
      {{"data.paths=-1 /x/a 2 /x/b"}, "the weight of /x/a (-1) must be a positive number"},
      {{"data.paths=0.3 /x/a /x/b /x/c"}, "data.paths: the blend list"},
      {{"data.split=70,-20,10"}, "data.split: split \"70,-20,10\" holds '-'"},
      {{"data.split=1,2,3,4"}, "data.split: split \"1,2,3,4\" has 4 numbers"},
      {{"data.seed=-5"}, "data.seed: random seed -5"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.overrides, " "));
    std::vector<std::string> overrides = blend;
    overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
    EXPECT_THAT(Read(overrides),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  TrainConfig config;
  config.set_run_dir("/tmp/run");
  config.mutable_step_scheduler()->set_local_batch_size(1);
  config.mutable_data()->set_sequence_length(128);
  config.mutable_data()->set_paths("/x/a");
  EXPECT_THAT(ReadOptions(config), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("set step_scheduler.max_steps")));
}

// model.pretrained_path with a config.json: the family and every size come from it, what it
// does not hold (the padding multiple, the sequence length) from the configuration, and a field
// set to another value than the file's is an error naming both.
// A setting that the rest of the configuration leaves unread is refused, each named with its
// value and what it applies to; with what it applies to, it is read.
TEST(ReadOptionsTest, SettingsThatApplyToNothingAreRefused) {
  struct Case {
    std::string setting;
    std::string message;
    std::vector<std::string> applying;  // the settings under which it is read
  };
  const std::vector<Case> cases = {
      {"data.split=100,0,0",
       "data.split (\"100,0,0\") applies to Megatron's GPT datasets, and data.paths is empty; "
       "allowed: unset",
       {"data.paths=/x/a"}},
      {"data.seed=7", "data.seed (7) applies to Megatron's GPT datasets", {"data.paths=/x/a"}},
      {"data.index_mapping_dir=/x/cache",
       "data.index_mapping_dir (\"/x/cache\") applies to Megatron's GPT datasets",
       {"data.paths=/x/a"}},
      {"data.overlong=truncate",
       "data.overlong (\"truncate\") applies to conversations, and data.format is not \"sft\"",
       {"data.format=sft", "data.prefix=chat"}},
      {"sampler.pad_samples_to_global_batch_size=true",
       "sampler.pad_samples_to_global_batch_size (true) applies to the last batch of the "
       "sequential sampler, and sampler.dataloader_type is not \"single\" with drop_last false",
       {"sampler.dataloader_type=single", "sampler.drop_last=false"}},
      {"model.moe_router_topk=2",
       "model.moe_router_topk (2) applies to mixture-of-experts models, and "
       "model.num_moe_experts is 0",
       {"model.num_moe_experts=4"}},
      {"model.moe_aux_loss_coeff=0.01",
       "model.moe_aux_loss_coeff (0.01) applies to mixture",
       {"model.num_moe_experts=4"}},
      {"model.moe_layer_freq=2",
       "model.moe_layer_freq (2) applies to mixture",
       {"model.num_moe_experts=4"}},
      {"model.moe_router_pre_softmax=true",
       "model.moe_router_pre_softmax (true) applies to",
       {"model.num_moe_experts=4"}},
      {"model.recompute_method=uniform",
       "model.recompute_method (\"uniform\") applies to recomputation, and "
       "model.recompute_granularity is unset",
       {"model.recompute_granularity=full", "model.recompute_num_layers=1"}},
      {"model.recompute_num_layers=1",
       "model.recompute_num_layers (1) applies to recomputation",
       {"model.recompute_granularity=full", "model.recompute_method=block"}},
      {"model.recompute_modules=mlp",
       "model.recompute_modules (\"mlp\") applies to selective recomputation, and "
       "model.recompute_granularity is not \"selective\"",
       {"model.recompute_granularity=selective"}},
      {"lr_scheduler.wsd_decay_steps=5",
       "lr_scheduler.wsd_decay_steps (5) applies to the WSD schedule, and "
       "lr_scheduler.lr_decay_style is not \"WSD\"",
       {"lr_scheduler.lr_decay_style=WSD", "lr_scheduler.lr_wsd_decay_style=linear"}},
      {"lr_scheduler.lr_wsd_decay_style=linear",
       "lr_scheduler.lr_wsd_decay_style (\"linear\") applies to the WSD schedule",
       {"lr_scheduler.lr_decay_style=WSD", "lr_scheduler.wsd_decay_steps=5"}},
      {"logging.profile_after_step=3",
       "logging.profile_after_step (3) applies to profiles, and logging.profile_steps is 0",
       {"logging.profile_steps=2"}},
      {"numerics.max_consecutive_skipped_steps=3",
       "numerics.max_consecutive_skipped_steps (3) applies to skipped steps, and "
       "numerics.on_nonfinite is not \"skip\"",
       {"numerics.on_nonfinite=skip"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.setting);
    EXPECT_THAT(Read({c.setting}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
    std::vector<std::string> applying = c.applying;
    applying.push_back(c.setting);
    KEEL_EXPECT_OK(Read(applying).status());
  }
  // Full recomputation reads no modules; a list is named whole.
  EXPECT_THAT(Read({"model.recompute_granularity=full", "model.recompute_method=uniform",
                    "model.recompute_num_layers=1", "model.recompute_modules=mlp,layernorm"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.recompute_modules (\"mlp\", \"layernorm\") applies to "
                                 "selective")));
}

TEST(ReadOptionsTest, APretrainedConfigGivesTheModel) {
  const std::string hf = "model.pretrained_path=testdata/hf_parity/qwen3";
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({hf}));
  EXPECT_EQ(options.model.family, models::ModelFamily::kQwen3);
  EXPECT_EQ(options.model.hidden_size, 64);
  EXPECT_EQ(options.model.kv_channels, 24);
  EXPECT_EQ(options.model.make_vocab_size_divisible_by, 1);
  EXPECT_EQ(options.model.max_sequence_length, 128);
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions padded,
                            Read({hf, "model.make_vocab_size_divisible_by=64", "model.num_layers=2",
                                  "model.family=qwen3"}));
  EXPECT_EQ(padded.model.make_vocab_size_divisible_by, 64);
  EXPECT_THAT(Read({hf, "model.num_layers=4"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.num_layers (4) contradicts testdata/hf_parity/qwen3/"
                                       "config.json, whose num_hidden_layers makes it 2"))));
  EXPECT_THAT(Read({hf, "model.family=llama"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.family (\"llama\") contradicts")));
  EXPECT_THAT(Read({"model.pretrained_path=testdata/hf_parity/qwen3", "model.num_moe_experts=2"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.num_moe_experts (2) with model.family \"qwen3\"")));
}

// model.pretrained_path without a config.json: the model is the configuration's, and the
// files' headers are read at once, before any data is prepared (and in the dry run): a
// directory without weights, or with a file that is not safetensors, is refused by name.
TEST(ReadOptionsTest, APretrainedDirectoryWithoutConfigIsCheckedForItsWeights) {
  const std::string empty = keel::testing::NewTempDir("no_weights");
  EXPECT_THAT(
      Read({"model.pretrained_path=" + empty}),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.pretrained_path: " + empty +
                                                      " holds neither model.safetensors nor "
                                                      "model.safetensors.index.json")));
  const std::string broken = keel::testing::NewTempDir("broken_weights");
  keel::testing::WriteFileOrFail(broken + "/model.safetensors", "not a safetensors file");
  EXPECT_THAT(Read({"model.pretrained_path=" + broken}),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("model.pretrained_path: " + broken + "/model.safetensors")));
  const std::string weights = keel::testing::NewTempDir("weights_alone");
  keel::testing::WriteFileOrFail(
      weights + "/model.safetensors",
      keel::testing::ReadFileOrFail("testdata/hf_parity/qwen3/model.safetensors"));
  KEEL_EXPECT_OK(Read({"model.pretrained_path=" + weights}).status());
}

// Text that checkpoints record (the fingerprint's paths and module patterns) must be UTF-8:
// protobuf text holds nothing else, and such a run once trained up to its first save, then
// failed there. The run directory is not recorded, so any bytes do.
TEST(ReadOptionsTest, TextTheCheckpointsRecordMustBeUtf8) {
  const std::string latin1 = keel::testing::NewTempDir("latin1") + "/mod\xe8le";
  ASSERT_TRUE(std::filesystem::create_directory(latin1));
  for (const char* file : {"/config.json", "/model.safetensors"}) {
    keel::testing::WriteFileOrFail(
        latin1 + file,
        keel::testing::ReadFileOrFail(std::string("testdata/hf_parity/qwen3") + file));
  }
  const size_t byte = latin1.size() - 3;
  EXPECT_THAT(
      Read({"model.pretrained_path=" + latin1}),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          AllOf(HasSubstr("model.pretrained_path \""),
                HasSubstr(absl::StrCat("is not UTF-8 (byte ", byte, " starts no character)")))));
  EXPECT_THAT(Read({"peft.target_modules=*.q_proj,*.v_pr\xc3"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("peft.target_modules[1] \"*.v_pr\\ufffd\" is not UTF-8 (byte 6")));
  KEEL_EXPECT_OK(Read({"run_dir=runs/r\xff"}).status());
}

TEST(ReadOptionsTest, ConfigFileErrorsNameTheFile) {
  EXPECT_THAT(LoadTrainConfig("/nonexistent/train.textproto", {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/train.textproto")));
  const std::string typo = keel::testing::NewTempDir("typo") + "/typo.textproto";
  keel::testing::WriteFileOrFail(typo, "model {\n  num_layer: 2\n}\n");
  EXPECT_THAT(LoadTrainConfig(typo, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("typo.textproto: line 2, column "),
                             HasSubstr("no field named \"num_layer\""))));
}

TEST(CheckGeometryTest, GlobalBatchMustDivideOverRanksAndMicroBatches) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({"step_scheduler.global_batch_size=16",
                                                        "step_scheduler.local_batch_size=4"}));
  for (int world_size : {1, 2, 4}) {
    SCOPED_TRACE(world_size);
    EXPECT_THAT(CheckGeometry(options, world_size), keel::testing::IsOk());
  }
  // 16 / 4 = 4 micro-batches in all: 3 ranks cannot share them evenly.
  EXPECT_THAT(CheckGeometry(options, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("global_batch_size (16)"),
                             HasSubstr("(4) x the world size "
                                       "(3) = 12"),
                             HasSubstr("world sizes that work with this local_batch_size: 1, 2, 4"),
                             HasSubstr("local_batch_size values that work on 3 data-parallel "
                                       "rank(s): none"))));
  KEEL_ASSERT_OK_AND_ASSIGN(
      options, Read({"step_scheduler.global_batch_size=6", "step_scheduler.local_batch_size=4"}));
  EXPECT_THAT(CheckGeometry(options, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("local_batch_size values that work on 1 data-parallel rank(s): "
                                 "1, 2, 3, 6")));
}

// The layout on the world: the data-parallel size is what tp x pp x cp leave of it, and sizes
// that do not divide the world are an error naming the numbers, as are fewer micro-batches
// than pipeline stages.
TEST(CheckGeometryTest, ModelParallelSizesMustDivideTheWorld) {
  KEEL_ASSERT_OK_AND_ASSIGN(TrainOptions options, Read({"step_scheduler.global_batch_size=16",
                                                        "step_scheduler.local_batch_size=4"}));
  options.distributed.parallel.tensor_model_parallel_size = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(parallel::MeshLayout layout, CheckGeometry(options, 8));
  EXPECT_EQ(layout.data_parallel_size(), 4);
  EXPECT_THAT(CheckGeometry(options, 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("distributed"), HasSubstr("(3)"), HasSubstr("2"))));
  // 16 / 4 = 4 micro-batches: not over 8 data-parallel ranks, but over 8 / 4 = 2 (pp = 4).
  options.distributed.parallel.tensor_model_parallel_size = 1;
  EXPECT_THAT(CheckGeometry(options, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the world size (8)")));
  options.distributed.parallel.pipeline_model_parallel_size = 4;
  EXPECT_THAT(CheckGeometry(options, 8),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the 1F1B schedule of distributed.pipeline_model_parallel_size 4 "
                                 "needs at least 4 micro-batches per step, got "
                                 "step_scheduler.global_batch_size (16) / (local_batch_size (4) x "
                                 "data-parallel size (2)) = 2; global_batch_size values that "
                                 "work: multiples of 8 from 32")));
  options.local_batch_size = 2;
  KEEL_ASSERT_OK_AND_ASSIGN(layout, CheckGeometry(options, 8));
  EXPECT_EQ(layout.data_parallel_size(), 2);
}

}  // namespace
}  // namespace keel::tools::recipe
