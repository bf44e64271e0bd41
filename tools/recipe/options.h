// Everything a training run needs to know, read once from a TrainConfig (config.proto) and
// checked: the components' options structs, filled by field name (config.h's CopyFields),
// plus the recipe's own settings. Config errors are found here, before anything is built.
//
//   KEEL_ASSIGN_OR_RETURN(TrainConfig config, LoadTrainConfig(path, overrides));
//   KEEL_ASSIGN_OR_RETURN(TrainOptions options, ReadOptions(config));
//   KEEL_RETURN_IF_ERROR(CheckGeometry(options, world_size));
#ifndef KEEL_TOOLS_RECIPE_OPTIONS_H_
#define KEEL_TOOLS_RECIPE_OPTIONS_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "base/json.h"
#include "checkpoint/checkpoint.h"
#include "models/model_options.h"
#include "optim/param_scheduler.h"
#include "parallel/mesh_layout.h"
#include "parallel/process_group.h"
#include "peft/lora_options.h"
#include "sampling/fixed_window_dataset.h"
#include "sampling/megatron_sampler.h"
#include "sampling/sequence_packing.h"
#include "scheduling/step_scheduler.h"
#include "tools/recipe/config.pb.h"
#include "tools/recipe/lr_schedule.h"
#include "tools/recipe/sft_data.h"

namespace keel::tools::recipe {

// The fields of NeMo AutoModel's MegatronPretrainingConfig
// (nemo_automodel/components/datasets/llm/megatron_dataset.py) that the trainer reads, same
// names and defaults; seq_length is data.sequence_length. With paths set, the run trains on
// Megatron's GPT datasets (tools/recipe/megatron_data.h): the training split holds
// max_steps x global_batch_size samples, validation comes from the split.
struct MegatronDataOptions {
  // "prefix ..." or "weight prefix weight prefix ..." (Megatron's --data-path); empty: not
  // used. Default: "".
  std::string paths;
  // GPTDatasetConfig.random_seed. Default: 1234.
  int64_t seed = 1234;
  // Train, validation and test weights. Default: "900,50,50".
  std::string split = "900,50,50";
  // path_to_cache, where the index caches go; empty: Megatron's default beside each dataset,
  // "<prefix>/cache/GPTDataset_indices". Default: "".
  std::string index_mapping_dir;
};

template <typename O, typename V, base::IsFieldsOf<O, MegatronDataOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("paths", o.paths);
  v("seed", o.seed);
  v("split", o.split);
  v("index_mapping_dir", o.index_mapping_dir);
}

// data.validation_every_n_samples when the configuration leaves it unset without data.paths.
inline constexpr int64_t kValidationEveryNSamples = 20;

struct DataOptions {
  // Megatron indexed dataset prefix (<prefix>.idx/.bin); empty: the default corpus, prepared
  // into <run_dir>/data. Default: "".
  std::string prefix;
  // GPT windows over the dataset.
  sampling::FixedWindowDatasetOptions dataset;
  // Every N-th window validates; 0: no validation set. Default: 0 (the configuration's,
  // unset: kValidationEveryNSamples, or 0 with data.paths).
  int64_t validation_every_n_samples = 0;
  // Megatron's GPT datasets instead of prefix (paths set).
  MegatronDataOptions megatron;
  // data.format and data.overlong: conversations at prefix instead of windows.
  SftDataOptions sft;
};

// torch::optim::AdamW's options (the trainer's only optimizer), with its defaults.
struct OptimizerOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // torch.optim.AdamW's fused (optim::FusedAdamW, LibTorch 2.x); nullopt: fused on GPUs, per
  // parameter on the CPU. Default: nullopt.
  std::optional<bool> fused;
};

template <typename O, typename V, base::IsFieldsOf<O, OptimizerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("beta1", o.beta1);
  v("beta2", o.beta2);
  v("eps", o.eps);
  v("weight_decay", o.weight_decay);
  v("fused", o.fused);
}

struct DistributedOptions {
  // Gloo on the CPU; NCCL on this rank's GPU (a --config=cuda build). Default: kGloo.
  parallel::Backend backend = parallel::Backend::kGloo;
  // A collective or rendezvous that takes longer fails the run. Phases only rank 0 runs (index
  // builds, dataset checks) are not bounded by it (RunOnRankZero). Default: 600, Megatron's
  // distributed_timeout_minutes (10).
  int64_t timeout_seconds = 600;
  // Megatron's use_distributed_optimizer: AdamW's state sharded over the data-parallel ranks
  // (optim::DistributedOptimizer); nothing to shard on one rank. Default: false.
  bool use_distributed_optimizer = false;
  // Megatron's grad_reduce_in_fp32 (model.bf16 runs only): float32 main gradients, else bf16.
  // Default: unset, true under model.bf16.
  std::optional<bool> grad_reduce_in_fp32;
  // Megatron's gradient_accumulation_fusion (model.bf16 runs only): the linear layers add their
  // weights' gradients into the main gradients from the weight-gradient product (on a GPU one
  // GEMM accumulating bf16 inputs in float32), with no bf16 .grad between
  // (gradients::DataParallelGradSyncOptions). Default: unset, true under model.bf16.
  std::optional<bool> gradient_accumulation_fusion;
  // The hang watchdog's timeout (WatchdogOptions::timeout_seconds): no progress in a step,
  // validation or checkpoint phase for this long ends the rank with every rank's phase
  // reported; 0: off. Default: unset, max(300, 10 x the longest phase so far).
  std::optional<int64_t> hang_timeout_seconds;
  // Megatron's sequence_parallel: with tensor_model_parallel_size > 1 the norms, the residual
  // stream and the activations between stages hold this rank's 1/tp of the sequence
  // (models::ModelGroups::sequence_parallel). Default: false.
  bool sequence_parallel = false;
  // The model-parallel layout, fields by Megatron's names (initialize_model_parallel); the
  // data-parallel size is the world size divided by tp x pp x cp. Default: all sizes 1.
  parallel::ModelParallelOptions parallel;
};

// grad_reduce_in_fp32 and gradient_accumulation_fusion as a model.bf16 run takes them: unset
// is true (Megatron's defaults).
inline bool MainGradientsInFloat32(const DistributedOptions& o) {
  return o.grad_reduce_in_fp32.value_or(true);
}
inline bool FusesGradientAccumulation(const DistributedOptions& o) {
  return o.gradient_accumulation_fusion.value_or(true);
}

// The layout's fields are the section's own (distributed.tensor_model_parallel_size, ...).
template <typename O, typename V, base::IsFieldsOf<O, DistributedOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("backend", o.backend);
  v("timeout_seconds", o.timeout_seconds);
  v("use_distributed_optimizer", o.use_distributed_optimizer);
  v("grad_reduce_in_fp32", o.grad_reduce_in_fp32);
  v("gradient_accumulation_fusion", o.gradient_accumulation_fusion);
  v("hang_timeout_seconds", o.hang_timeout_seconds);
  v("sequence_parallel", o.sequence_parallel);
  VisitFields(o.parallel, v);
}

struct LoggingOptions {
  // Progress line every N steps (and on validation steps). Default: 1.
  int64_t log_every_steps = 1;
  // TensorBoard event files under <run_dir>/tensorboard. Default: true.
  bool tensorboard = true;
  // Steps profiled after the first profile_after_step (rank 0; LibTorch 2.x); 0: none.
  // Defaults: 0, 5.
  int64_t profile_steps = 0;
  int64_t profile_after_step = 5;
};

template <typename O, typename V, base::IsFieldsOf<O, LoggingOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("log_every_steps", o.log_every_steps);
  v("tensorboard", o.tensorboard);
  v("profile_steps", o.profile_steps);
  v("profile_after_step", o.profile_after_step);
}

// What a non-finite loss or gradient norm does to the run (tools/recipe/numerics.h).
enum class NonFinitePolicy { kStop, kSkip };

// Parse the spellings "stop" and "skip" (false and an error listing them otherwise), or give
// them back; Abseil's flag hooks.
bool AbslParseFlag(absl::string_view text, NonFinitePolicy* out, std::string* error);
std::string AbslUnparseFlag(NonFinitePolicy policy);

struct NumericsOptions {
  // Megatron's check_for_nan_in_loss_and_grad: a non-finite loss or gradient norm on any rank
  // is caught before the optimizer step; false trains on (Megatron's
  // --no-check-for-nan-in-loss-and-grad). Default: true.
  bool check_for_nan_in_loss_and_grad = true;
  // Keel: kStop ends the run there (exit 1), kSkip drops the step on every rank (no update, no
  // learning-rate step), counted in the metrics and checkpoints. Default: kStop.
  NonFinitePolicy on_nonfinite = NonFinitePolicy::kStop;
  // Keel: with kSkip, this many consecutive skipped steps end the run. Default: 5.
  int64_t max_consecutive_skipped_steps = 5;
};

template <typename O, typename V, base::IsFieldsOf<O, NumericsOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("check_for_nan_in_loss_and_grad", o.check_for_nan_in_loss_and_grad);
  v("on_nonfinite", o.on_nonfinite);
  v("max_consecutive_skipped_steps", o.max_consecutive_skipped_steps);
}

struct TrainOptions {
  // The run's directory: metrics, TensorBoard events, plot, checkpoints, prepared data.
  std::string run_dir;
  // Seeds model initialisation. Default: 0.
  int64_t seed = 0;
  scheduling::StepSchedulerOptions step_scheduler;
  // Samples per micro-batch on each rank (the recipe's local_batch_size). Required, > 0.
  int64_t local_batch_size = 0;
  DataOptions data;
  // micro_batch_size and global_batch_size are the step scheduler's.
  sampling::MegatronSamplerOptions sampler;
  // max_sequence_length is data.dataset.sequence_length.
  models::ModelOptions model;
  // model.pretrained_path: Hugging Face safetensors that a new run (no checkpoint in run_dir)
  // loads the model's weights from before step 1, strictly (checkpoint::LoadHfSafetensors).
  // Empty: none. Default: empty.
  std::string pretrained_path;
  OptimizerOptions optimizer;
  // load_policy defaults to kCorrected here, unlike the library: what NeMo AutoModel's
  // scheduler does since its PR #3883. The trainer always loads into a fresh scheduler, so
  // the two policies differ only when a resume changes the weight-decay schedule: kCorrected
  // applies the checkpoint's to the first resumed step, kReference the configured one.
  // ReadOptions fills what the configuration leaves unset from `optimizer` (lr_schedule.h).
  optim::ParamSchedulerOptions lr_scheduler = [] {
    optim::ParamSchedulerOptions defaults;
    defaults.load_policy = optim::SchedulerLoadPolicy::kCorrected;
    return defaults;
  }();
  // The lr_scheduler step counts the run derives from its length (LrSchedule). Default: none.
  DerivedLrSteps derived_lr_steps;
  // Gradient-norm clipping threshold; infinity clips nothing (the norm is still logged).
  double max_norm = std::numeric_limits<double>::infinity();
  // model.tf32: float32 matrix products on TF32 tensor cores (GPU runs only). Default: false.
  bool tf32 = false;
  // model.bf16: Megatron's bf16 mixed precision (bf16 parameters and activations, float32 main
  // gradients and parameters). Default: false.
  bool bf16 = false;
  // clip_grad.check_norm_every_steps, Keel's: every N-th step the norm is checked against one
  // computed from every rank's gradient blocks counted once; 0: never. Default: 0.
  int64_t check_norm_every_steps = 0;
  // checkpoint_dir defaults to <run_dir>/checkpoints.
  checkpoint::CheckpointerOptions checkpoint;
  DistributedOptions distributed;
  LoggingOptions logging;
  NumericsOptions numerics;
  // The peft section: LoRA adapters on the linear layers it selects; nullopt: none (the whole
  // model trains). Default: nullopt.
  std::optional<peft::LoraOptions> peft;
  // peft.adapter_path: a Hugging Face peft adapter directory whose weights a new run's adapters
  // start from (its r, lora_alpha, lora_dropout and target modules are peft's fields). Default:
  // empty (A drawn, B zero).
  std::string peft_adapter_path;
  // Conversations packed into sequences (data.format "sft" only). Default: none.
  sampling::PackedSequenceOptions packed_sequence;
};

// Reads and checks `config`. Errors: kInvalidArgument naming "<section>.<field>", its value
// and what is allowed: an empty run_dir, a bad enum spelling, a non-positive
// local_batch_size or model size, hidden_size not divisible by num_attention_heads, a
// validation_every_n_samples of 1 or below 0, an optimizer other than AdamW, a backend other
// than gloo or nccl, a non-positive timeout or logging interval, model.tf32 without a GPU,
// distributed.grad_reduce_in_fp32 without model.bf16, peft options CheckLoraOptions refuses,
// a negative packed_sequence.packed_sequence_size or a positive one without data.format "sft",
// distributed.sequence_parallel with tensor_model_parallel_size 1, with model.num_moe_experts
// or with a sequence length (data.sequence_length, or packed_sequence_size) that tp does not
// divide, with data.paths: data.prefix or validation_every_n_samples also set, no
// step_scheduler.max_steps, a bad blend list (a weight that is not a positive number), split
// string or seed.
[[nodiscard]] absl::StatusOr<TrainOptions> ReadOptions(const TrainConfig& config);

// The checks of a model's sizes and values that every entry point makes before it builds one
// (ReadOptions for the trainer, LoadOneRankModel for tools:eval and tools:ckpt): sizes
// positive, heads that divide the hidden size or an even head width, key-value groups that
// divide the heads, a positive RoPE base and norm epsilon, llama3 factors that rescale.
// Errors: kInvalidArgument naming the field (model.<name>) and what is allowed.
[[nodiscard]] absl::Status CheckModelValues(const models::ModelOptions& options);

// The model-parallel layout on `world_size` ranks, and whether the batch geometry works with
// its data-parallel size: global_batch_size must be a multiple of local_batch_size x the
// data-parallel size. Errors: kInvalidArgument naming the numbers: sizes that do not divide
// the world size (or another layout Megatron refuses), or batch sizes that do not fit, with the
// world sizes or local batch sizes that would work.
[[nodiscard]] absl::StatusOr<parallel::MeshLayout> CheckGeometry(const TrainOptions& options,
                                                                 int world_size);

// The run's configuration for its checkpoints: every option's effective value (defaults
// included), as {"<section>": {"<field>": value}} plus the top-level fields. Where the run lives
// (run_dir, checkpoint.checkpoint_dir) is left out: a run directory may move.
base::Json ConfigFingerprint(const TrainOptions& options);

// The run's configuration in its checkpoints, under kConfigState: its ConfigFingerprint, saved
// with each one and compared before a resume (Run::CheckConfig); loading it restores nothing,
// so checkpoints written before Keel saved it load as well.
inline constexpr char kConfigState[] = "config";
// The model's object in the trainer's checkpoints (checkpoint::ModelState).
inline constexpr char kModelState[] = "model";
// Its field that says the model trains in bf16 (model.bf16).
inline constexpr char kBf16Field[] = "bf16";
// The model a checkpoint's configuration (a ConfigFingerprint) describes, the Hugging Face
// directory its run started from (model.pretrained_path; empty: none), the rows of its padded
// vocabulary (0: not saved), and the format that decides its keys
// (checkpoint.model_save_format, checkpoint::ModelStateOptions').
struct SavedModel {
  models::ModelOptions options;
  std::string pretrained_path;
  int64_t padded_vocab_size = 0;
  checkpoint::SerializationFormat model_save_format = checkpoint::SerializationFormat::kKeel;
  // A LoRA run's adapters (its model object holds them alone, ModelState's is_peft keys; the
  // frozen base is pretrained_path's, or without one the seed's initialisation).
  std::optional<peft::LoraOptions> peft;
  int64_t seed = 0;
};
// Errors: kInvalidArgument naming a missing "model" section or a field of the wrong type.
[[nodiscard]] absl::StatusOr<SavedModel> ReadSavedModel(const base::Json& fingerprint);
class ConfigState : public checkpoint::Stateful {
 public:
  explicit ConfigState(base::Json fingerprint) : fingerprint_(std::move(fingerprint)) {}
  [[nodiscard]] absl::StatusOr<checkpoint::State> StateDict() const override;
  [[nodiscard]] absl::Status LoadStateDict(checkpoint::StateReader&) override;

 private:
  base::Json fingerprint_;
};

// How a checkpoint's configuration differs from this run's.
struct ConfigChanges {
  // One line per field that differs: "<section>.<field>: <saved> in the checkpoint, <now> now"
  // ("absent" for a field one side lacks).
  std::vector<std::string> changed;
  // The lines of fields that a resume cannot work with: the model's shapes and vocabulary
  // (model.*, data.sequence_length).
  std::vector<std::string> incompatible;
};

ConfigChanges CompareConfigs(const base::Json& saved, const base::Json& current);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_OPTIONS_H_
