#include "tools/recipe/run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "c10/util/accumulate.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/model_state.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/reader.h"
#include "checkpoint/training_state.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/norm_check.h"
#include "optim/data_parallel_optimizer.h"
#include "optim/param_scheduler.h"
#include "parallel/device_mesh.h"
#include "parallel/moe/token_dispatcher.h"
#include "parallel/pipeline_parallel/schedules.h"
#include "parallel/tensor_parallel/mappings.h"
#include "sampling/megatron_sampler.h"
#include "sampling/resumable_blend.h"
#include "scheduling/step_scheduler.h"
#include "tools/recipe/data.h"
#include "tools/recipe/gpt.h"
#include "tools/recipe/megatron_data.h"
#include "tools/recipe/numerics.h"
#include "tools/recipe/optimizer.h"
#include "tools/recipe/plot.h"
#include "tools/recipe/profile.h"
#include "tools/recipe/run_dir_lock.h"
#include "tools/recipe/stages.h"
#include "tools/recipe/tensorboard.h"
#include "torch/utils.h"

namespace keel::tools::recipe {
namespace {

using Clock = std::chrono::steady_clock;
using Scheduler = scheduling::StepScheduler<sampling::MegatronSampler>;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Labels of `batch` that count.
int64_t LabelTokens(const TokenBatch& batch) {
  if (!batch.loss_mask.defined()) return batch.labels.numel();
  return static_cast<int64_t>(batch.loss_mask.sum().item<double>());
}

// The layout dimension of the experts (parallel::GroupedMlp's).
constexpr char kExpertDim[] = "ep";

}  // namespace

// Everything the run builds, in the order it is built.
class Run::State {
 public:
  explicit State(TrainData data) : data(std::move(data)) {}

  TrainData data;
  std::optional<Gpt> model;
  std::unique_ptr<optim::DataParallelOptimizer> optimizer;
  std::optional<optim::ParamScheduler> lr_scheduler;
  std::optional<Scheduler> scheduler;
  // The sampler's state before any step, for ResetState.
  sampling::MegatronSamplerState initial_sampler_state;
  // What a checkpoint holds, under these names.
  std::unique_ptr<checkpoint::ModelState> model_state;
  std::optional<checkpoint::OptimizerState> optim_state;
  std::unique_ptr<checkpoint::Stateful> step_state;
  std::unique_ptr<checkpoint::Stateful> sampler_state;
  std::unique_ptr<checkpoint::RngState> rng_state;
  std::unique_ptr<ConfigState> config_state;
  std::unique_ptr<NonFiniteGuard> numerics;
  // data.paths: the training blend's state ("data"), and the one a resume loaded.
  std::unique_ptr<checkpoint::Stateful> data_state;
  std::optional<sampling::BlendState> loaded_blend;
  checkpoint::Statefuls statefuls;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  // Rank 0's outputs.
  std::optional<JsonlWriter> jsonl;
  std::optional<StepProfiler> profiler;
  std::optional<TensorBoardWriter> tensorboard;
  // Time spent in the scheduler, the sampler and the LR schedule.
  Clock::duration bookkeeping{};
  // Time spent after the backward passes waiting for the data-parallel gradient reduction.
  Clock::duration gradient_wait{};
  // Label tokens since the last progress line, and when it was.
  Clock::time_point loop_start;
  // parallel::TensorParallelCollectiveSeconds() and PipelineWaitSeconds() when the loop
  // started.
  double tensor_parallel_start = 0.0;
  double pipeline_wait_start = 0.0;
  double expert_dispatch_start = 0.0;
  Clock::time_point interval_start;
  int64_t interval_tokens = 0;

  // Runs `fn`, adding its time to `total`.
  template <typename Fn>
  static decltype(auto) Timed(Clock::duration& total, Fn&& fn) {
    struct Timer {
      Clock::time_point start;
      Clock::duration& total;
      ~Timer() { total += Clock::now() - start; }
    } timer{Clock::now(), total};
    return fn();
  }

  // Runs `fn`, counting its time as bookkeeping.
  template <typename Fn>
  decltype(auto) Bookkept(Fn&& fn) {
    return Timed(bookkeeping, std::forward<Fn>(fn));
  }
};

Run::Run(const TrainOptions& options, TrainRuntime runtime)
    : options_(options), runtime_(std::move(runtime)) {}

Run::~Run() = default;

int64_t Run::step() const { return state_->scheduler->step(); }

absl::StatusOr<std::unique_ptr<Run>> Run::Build(const TrainOptions& options, TrainRuntime runtime) {
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(options.run_dir));
  std::unique_ptr<Run> run(new Run(options, std::move(runtime)));
  KEEL_ASSIGN_OR_RETURN(TrainData data, OpenTrainData(run->options_, run->runtime_));
  run->state_ = std::make_unique<State>(std::move(data));
  State& s = *run->state_;
  absl::StatusOr<Scheduler> scheduler = scheduling::BuildStepScheduler(
      options.step_scheduler, *s.data.sampler, run->runtime_.dp_size, options.local_batch_size,
      run->runtime_.control_group, std::move(run->runtime_.preemption));
  KEEL_RETURN_IF_ERROR(base::Annotate(
      scheduler.status(), absl::StrCat("step_scheduler over the ", s.data.splits.train_size(),
                                       " training windows of ", s.data.prefix)));
  s.scheduler = *std::move(scheduler);
  s.initial_sampler_state = s.data.sampler->State();
  KEEL_RETURN_IF_ERROR(run->BuildModel());
  KEEL_RETURN_IF_ERROR(run->BuildCheckpointing());
  return run;
}

// The model (initialised on the CPU from the default generator, seeded here, so every device
// and every tensor-parallel size starts from the same weights), AdamW with the data-parallel
// sync over the parameters' layouts, and the LR schedule.
absl::Status Run::BuildModel() {
  State& s = *state_;
  if (options_.tf32) base::SetCudaMatmulTf32(true);
  torch::manual_seed(options_.seed);
  s.model.emplace(options_.model, runtime_.tp_group, runtime_.pp_group, runtime_.ep_group,
                  runtime_.expert_tp_group);
  (*s.model)->to(runtime_.device);
  if (options_.bf16) (*s.model)->to(at::kBFloat16);
  std::vector<gradients::NamedParameter> parameters =
      gradients::TrainableParameters({s.model->get()}, (*s.model)->Layouts());
  MarkSharedEmbedding(*s.model, parameters);
  KEEL_ASSIGN_OR_RETURN(s.optimizer,
                        BuildOptimizer(std::move(parameters), options_, runtime_, kExpertDim));
  KEEL_ASSIGN_OR_RETURN(s.lr_scheduler, optim::ParamScheduler::Create(options_.lr_scheduler,
                                                                      s.optimizer->optimizer()));
  return absl::OkStatus();
}

// Everything a checkpoint holds, and the checkpointer.
absl::Status Run::BuildCheckpointing() {
  State& s = *state_;
  checkpoint::ModelStateOptions model_state_options;
  model_state_options.model_save_format = options_.checkpoint.model_save_format;
  model_state_options.layouts = (*s.model)->Layouts();
  // With bf16 parameters the checkpoint holds their float32 main copies (each rank's shards of
  // them with the distributed optimizer): the truth, which a float32 run loads too.
  if (s.optimizer->has_main_copies()) {
    for (const gradients::NamedParameter& p : s.optimizer->StepParameters()) {
      model_state_options.stand_ins[p.name] = checkpoint::TensorRef{p.param, p.layout};
    }
  }
  s.model_state = std::make_unique<checkpoint::ModelState>(**s.model, model_state_options);
  KEEL_ASSIGN_OR_RETURN(s.optim_state,
                        checkpoint::OptimizerState::Create(*s.optimizer, &*s.lr_scheduler));
  Scheduler& scheduler = *s.scheduler;
  s.step_state = std::make_unique<checkpoint::ValueState<scheduling::StepSchedulerState>>(
      [&scheduler] { return scheduler.StateDict(); },
      [&scheduler](const scheduling::StepSchedulerState& state) {
        return scheduler.LoadStateDict(state);
      });
  sampling::MegatronSampler& sampler = *s.data.sampler;
  s.sampler_state = std::make_unique<checkpoint::ValueState<sampling::MegatronSamplerState>>(
      [&sampler] { return sampler.State(); },
      [&sampler](const sampling::MegatronSamplerState& state) { return sampler.LoadState(state); });
  checkpoint::RngStateOptions rng_options;
  rng_options.allow_world_size_change = true;  // see ContinueOnNewWorldSize
  s.rng_state = std::make_unique<checkpoint::RngState>(
      runtime_.rank, runtime_.world_size, at::detail::getDefaultCPUGenerator(), rng_options);
  s.config_state = std::make_unique<ConfigState>(ConfigFingerprint(options_));
  s.numerics = std::make_unique<NonFiniteGuard>(options_.numerics);
  s.statefuls = {{kConfigState, s.config_state.get()},
                 {"model", s.model_state.get()},
                 {"numerics", s.numerics.get()},
                 {"optim", &*s.optim_state},
                 {"rng", s.rng_state.get()},
                 {"sampler", s.sampler_state.get()},
                 {"step_scheduler", s.step_state.get()}};
  if (MegatronData* megatron = s.data.splits.megatron()) {
    s.data_state = std::make_unique<checkpoint::ValueState<sampling::BlendState>>(
        [megatron, &sampler] { return megatron->State(sampler.consumed_samples()); },
        [&s](const sampling::BlendState& state) {
          s.loaded_blend = state;
          return absl::OkStatus();
        });
    s.statefuls["data"] = s.data_state.get();
  }
  KEEL_ASSIGN_OR_RETURN(s.checkpointer, checkpoint::Checkpointer::Create(
                                            options_.checkpoint, runtime_.checkpoint_group));
  return base::MakeDirectories(options_.checkpoint.checkpoint_dir);
}

absl::StatusOr<std::optional<std::string>> Run::Resume() {
  State& s = *state_;
  std::vector<std::string> changes;
  checkpoint::ResumeOptions resume;
  resume.before_load = [&](const checkpoint::CheckpointInfo& info) {
    return CheckConfig(info.path, changes);
  };
  resume.reset = [this] { return ResetState(); };
  KEEL_ASSIGN_OR_RETURN(checkpoint::ResumeResult result,
                        s.checkpointer->LoadLatest(s.statefuls, resume));
  std::ostream& log = *runtime_.log;
  const bool chief = runtime_.rank == 0;
  if (chief) {
    for (const std::string& warning : result.warnings) log << "warning: " << warning << "\n";
  }
  result_.start_step = s.scheduler->step();
  if (!result.loaded) {
    if (chief && !result.quarantined.empty())
      log << "warning: no checkpoint loads; starting afresh\n";
    KEEL_RETURN_IF_ERROR(LoadPretrained());
    s.optimizer->CopyModelToMain();
    return std::nullopt;
  }
  // The main copies were loaded: the bf16 parameters are their rounded values.
  KEEL_RETURN_IF_ERROR(s.optimizer->CopyMainToModel());
  if (chief && !options_.pretrained_path.empty()) {
    log << "model: resuming from the run's own checkpoint, not from model.pretrained_path ("
        << options_.pretrained_path << ")\n";
  }
  if (chief) {
    for (const std::string& change : changes) {
      log << "warning: the configuration differs from the checkpoint's: " << change << "\n";
    }
    log << "resumed from " << result.loaded->path << "\n";
  }
  if (const std::optional<int64_t> saved = s.rng_state->saved_world_size();
      saved.has_value() && *saved != runtime_.world_size) {
    ContinueOnNewWorldSize(*saved);
  }
  if (s.loaded_blend.has_value()) {
    KEEL_RETURN_IF_ERROR(s.data.splits.megatron()->Resume(*s.loaded_blend, options_, runtime_));
  }
  resumed_ = true;
  return result.loaded->path;
}

void Run::ContinueOnNewWorldSize(int64_t saved_world_size) {
  const State& s = *state_;
  // splitmix64's finalizer over (seed, rank, step): distinct, well-mixed seeds for every rank.
  uint64_t z = static_cast<uint64_t>(options_.seed);
  for (const int64_t part : {static_cast<int64_t>(runtime_.rank), s.scheduler->step()}) {
    z += 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(part);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  torch::manual_seed(z);
  if (runtime_.rank != 0) return;
  // The GPT of this recipe has no dropout: a model whose step draws random numbers must say
  // here that a resume on another number of ranks cannot be bit-identical.
  std::ostream& log = *runtime_.log;
  log << "rng: the checkpoint was saved by " << saved_world_size << " rank(s), resumed on "
      << runtime_.world_size
      << ": each rank's generator is seeded from the seed, its rank and the step (a training "
         "step of this model draws no random numbers: no result changes)\n";
  const sampling::MegatronSamplerOptions& sampler = options_.sampler;
  if (sampler.dataloader_type == sampling::DataloaderType::kCyclic &&
      sampler.shuffle_scope == sampling::ShuffleScope::kPerRank) {
    log << "sampler: \"cyclic\" with shuffle_scope \"per_rank\" draws the rest of this epoch "
           "from the buckets of "
        << runtime_.world_size
        << " rank(s): a sample of it may come twice or not at all (shuffle_scope \"global\" "
           "serves each exactly once on any number of ranks)\n";
  }
}

absl::Status Run::CheckConfig(const std::string& path, std::vector<std::string>& changes) const {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::CheckpointReader> reader,
                        checkpoint::CheckpointReader::Open(path));
  absl::StatusOr<base::Json> saved = reader->ReadValues(kConfigState);
  changes.clear();
  if (absl::IsNotFound(saved.status())) return absl::OkStatus();  // saved by an older Keel
  KEEL_RETURN_IF_ERROR(saved.status());
  ConfigChanges compared = CompareConfigs(*saved, ConfigFingerprint(options_));
  if (!compared.incompatible.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " holds another model, which this run cannot load: ",
                     absl::StrJoin(compared.incompatible, "; "),
                     "; resume with that model's configuration, or train in another run_dir"));
  }
  changes = std::move(compared.changed);
  return absl::OkStatus();
}

absl::Status Run::LoadPretrained() {
  if (options_.pretrained_path.empty()) return absl::OkStatus();
  checkpoint::ModelStateOptions layout;
  layout.model_save_format = options_.checkpoint.model_save_format;
  layout.layouts = (*state_->model)->Layouts();
  KEEL_ASSIGN_OR_RETURN(const std::set<std::string> other_stages,
                        KeysOfOtherStages(**state_->model, layout, runtime_));
  absl::StatusOr<checkpoint::HfImportResult> loaded = checkpoint::LoadHfSafetensors(
      options_.pretrained_path, **state_->model, layout, other_stages);
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(base::Annotate(loaded.status(), "model.pretrained_path"),
                                      runtime_, "loading model.pretrained_path"));
  if (runtime_.rank == 0) {
    *runtime_.log << "model: " << loaded->num_tensors << " tensors from "
                  << options_.pretrained_path
                  << (other_stages.empty() ? "" : " into the first pipeline stage") << " ("
                  << loaded->files.size() << " file(s)"
                  << (loaded->tied_checked.empty() ? "" : "; tied lm_head checked") << ")\n";
  }
  return absl::OkStatus();
}

absl::Status Run::ResetState() {
  State& s = *state_;
  KEEL_RETURN_IF_ERROR(s.scheduler->LoadStateDict(
      {options_.step_scheduler.start_step, options_.step_scheduler.start_epoch}));
  KEEL_RETURN_IF_ERROR(s.data.sampler->LoadState(s.initial_sampler_state));
  s.loaded_blend.reset();
  // The weights a new run starts from (and the generator after them), copied into the live
  // tensors, which the optimizer and the checkpoint's objects hold.
  torch::manual_seed(options_.seed);
  Gpt fresh(options_.model, runtime_.tp_group, runtime_.pp_group, runtime_.ep_group,
            runtime_.expert_tp_group);
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "resetting the model", [&] {
    at::NoGradGuard no_grad;
    auto live = (*s.model)->named_parameters();
    for (const auto& item : fresh->named_parameters()) live[item.key()].copy_(item.value());
  }));
  s.optimizer->Reset();
  s.numerics->Reset();
  KEEL_ASSIGN_OR_RETURN(s.lr_scheduler, optim::ParamScheduler::Create(options_.lr_scheduler,
                                                                      s.optimizer->optimizer()));
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> Run::Step(const std::vector<std::vector<int64_t>>& micro_batches) {
  State& s = *state_;
  // Label tokens of the global batch: the loss is their mean, however the batch is split.
  std::vector<TokenBatch> batches;
  int64_t local_tokens = 0;
  for (const std::vector<int64_t>& indices : micro_batches) {
    KEEL_ASSIGN_OR_RETURN(TokenBatch batch, s.data.splits.Batch(indices, /*validation=*/false));
    if (batch.defined()) {
      local_tokens += LabelTokens(batch);  // on the host: no wait for the device
      batch = batch.To(runtime_.device);
    }
    batches.push_back(std::move(batch));
  }
  at::Tensor global_tokens = at::full({1}, local_tokens, at::kLong);
  KEEL_RETURN_IF_ERROR(SumOverData(global_tokens, runtime_, "label-token count"));
  StepOutput output;
  output.label_tokens = global_tokens.item<int64_t>();
  const double label_tokens = static_cast<double>(output.label_tokens);
  output.lr = s.lr_scheduler->GetLr();
  s.optimizer->PrepareForGradAccumulation();
  // Gradients are averaged over the data-parallel ranks: scale so they sum to d(mean loss);
  // over pipeline stages the loss is summed and NeMo's PP scaling divides the gradients after.
  const bool pipelined = runtime_.pp_group != nullptr;
  gradients::GradScalingOptions scaling;
  scaling.pp_enabled = pipelined;
  scaling.num_label_tokens = output.label_tokens;
  scaling.dp_group_size = runtime_.dp_size;
  // NeMo's EP scaling: an expert's gradient gathers the tokens of every expert-parallel rank,
  // then averages over the expert data-parallel ones only.
  scaling.ep_shard_size =
      runtime_.mesh == nullptr ? 1 : runtime_.mesh->GroupSize(parallel::GroupKind::kExpertDp);
  scaling.ep_axis_name = kExpertDim;
  StageRunOptions stages;
  stages.loss_scale = pipelined ? 1.0 : static_cast<double>(runtime_.dp_size) / label_tokens;
  stages.activation_dtype = options_.bf16 ? at::kBFloat16 : at::kFloat;
  // Each micro-batch's load-balancing loss weighs 1 / micro-batches in the gradient (once the
  // PP scaling has divided the pipeline's gradients by label_tokens / dp).
  const double pp_scaling = pipelined ? label_tokens / static_cast<double>(runtime_.dp_size) : 1.0;
  (*s.model)->moe_stats().aux_loss_scale = pp_scaling / static_cast<double>(micro_batches.size());
  stages.before_last_backward = [&s] { s.optimizer->PrepareForFinalBackward(); };
  stages.without_backward = [&s] { s.optimizer->SkipBackward(); };
  KEEL_ASSIGN_OR_RETURN(const at::Tensor device_loss_sum,
                        RunStages(*s.model, batches, runtime_, stages));
  KEEL_RETURN_IF_ERROR(State::Timed(s.gradient_wait, [&] { return s.optimizer->Wait(); }));
  KEEL_RETURN_IF_ERROR(ReduceEmbeddingGrads(s.optimizer->StepParameters(), runtime_));
  KEEL_ASSIGN_OR_RETURN(const at::Tensor grad_norm,
                        s.optimizer->ClipGradNorm(options_.max_norm, scaling));
  // The step's one wait for the device: its loss and gradient norm, read together.
  const at::Tensor read =
      at::stack({device_loss_sum, grad_norm.to(device_loss_sum.device())}).to(at::kCPU);
  const double loss_sum = read[0].item<double>();
  output.grad_norm = read[1].item<double>();
  KEEL_RETURN_IF_ERROR(CheckNorm(output.grad_norm));
  at::Tensor step_loss = at::full({1}, loss_sum, at::kDouble);
  KEEL_RETURN_IF_ERROR(SumOverData(step_loss, runtime_, "step loss"));
  KEEL_RETURN_IF_ERROR(SumOverStages(step_loss, runtime_, "step loss"));
  output.loss = step_loss.item<double>() / label_tokens;
  if (options_.model.num_moe_experts > 0) {
    KEEL_RETURN_IF_ERROR(CollectMoeStats(output, static_cast<int64_t>(micro_batches.size())));
  }

  // Before the optimizer step: a non-finite value stops the run or drops the step everywhere.
  // What this rank contributed: its gradients' sum only when a value is non-finite (every rank
  // sees the same reduced loss and norm), to name the rank; not a pass over them every step.
  NonFiniteGuard::Local local{loss_sum, {}};
  if (!std::isfinite(output.loss) || !std::isfinite(output.grad_norm)) {
    local.gradient_sum = s.optimizer->LocalGradientSum();
  }
  KEEL_ASSIGN_OR_RETURN(
      NonFiniteGuard::Verdict verdict,
      s.numerics->Check(s.scheduler->step() + 1, output.loss, output.grad_norm, local, runtime_));
  if (verdict == NonFiniteGuard::Verdict::kSkip) {
    output.skipped = true;
    s.optimizer->SkipStep();
    return output;
  }
  KEEL_RETURN_IF_ERROR(s.optimizer->Step());
  KEEL_RETURN_IF_ERROR(s.Bookkept([&] { return s.lr_scheduler->Step(1); }));
  return output;
}

absl::Status Run::CollectMoeStats(StepOutput& output, int64_t micro_batches) {
  auto [aux, tokens] = (*state_->model)->moe_stats().Take(options_.model.num_moe_experts);
  for (at::Tensor* sum : {&aux, &tokens}) {
    KEEL_RETURN_IF_ERROR(SumOverData(*sum, runtime_, "the routing statistics"));
    KEEL_RETURN_IF_ERROR(SumOverStages(*sum, runtime_, "the routing statistics"));
  }
  output.moe_aux_loss = aux.item<double>() / static_cast<double>(micro_batches * runtime_.dp_size);
  output.tokens_per_expert =
      std::vector<int64_t>(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
  return absl::OkStatus();
}

absl::Status Run::CheckNorm(double norm) {
  const int64_t every = options_.check_norm_every_steps;
  const int64_t step = state_->scheduler->step() + 1;
  if (every == 0 || step % every != 0 || !std::isfinite(norm)) return absl::OkStatus();
  KEEL_ASSIGN_OR_RETURN(
      gradients::NormCheck check,
      gradients::CheckGradNorm(state_->optimizer->StepParameters(), runtime_.control_group));
  // The gradients are clipped by then: their norm is the norm times the clip coefficient.
  const double clipped = norm * std::min(1.0, options_.max_norm / (norm + 1e-6));
  if (check.Agrees(clipped)) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "step ", step, ": the gradient norm of the layouts' reductions (", clipped,
      " after clipping) differs from the norm of every rank's gradient blocks counted once (",
      check.norm, ")", check.problems.empty() ? "" : ": ", absl::StrJoin(check.problems, "; "),
      " (clip_grad.check_norm_every_steps: a parameter's layout is wrong)"));
}

absl::StatusOr<std::optional<double>> Run::Validate() {
  State& s = *state_;
  at::NoGradGuard no_grad;
  const Splits& splits = s.data.splits;
  const int64_t batch_size = options_.local_batch_size;
  // Every rank runs the same number of rounds (a batch each, or none at the end), so that all
  // poll for preemption together after each.
  const int64_t per_round = runtime_.dp_size * batch_size;
  const int64_t rounds = (splits.val_size() + per_round - 1) / per_round;
  at::Tensor loss_sum;  // on the device, read once at the end
  int64_t tokens = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t start = round * per_round + runtime_.dp_rank * batch_size;
    std::vector<int64_t> indices;
    for (int64_t k = start; k < std::min(start + batch_size, splits.val_size()); ++k) {
      indices.push_back(k);
    }
    std::vector<TokenBatch> batch(1);
    KEEL_ASSIGN_OR_RETURN(batch[0], splits.Batch(indices, /*validation=*/true));
    if (batch[0].defined()) {
      tokens += LabelTokens(batch[0]);
      batch[0] = batch[0].To(runtime_.device);
    }
    StageRunOptions forward_only;
    forward_only.forward_only = true;
    forward_only.activation_dtype = options_.bf16 ? at::kBFloat16 : at::kFloat;
    KEEL_ASSIGN_OR_RETURN(const at::Tensor batch_loss,
                          RunStages(*s.model, batch, runtime_, forward_only));
    loss_sum = loss_sum.defined() ? loss_sum + batch_loss : batch_loss;
    if (s.scheduler->PollPreemption()) {
      if (runtime_.rank == 0) {
        *runtime_.log << "validation stopped after " << round + 1 << " of " << rounds
                      << " batches: preemption requested\n";
      }
      return std::nullopt;
    }
  }
  // The last stage's.
  at::Tensor stage_loss =
      at::full({1}, loss_sum.defined() ? loss_sum.item<double>() : 0.0, at::kDouble);
  KEEL_RETURN_IF_ERROR(SumOverStages(stage_loss, runtime_, "validation loss"));
  at::Tensor totals =
      at::tensor({stage_loss.item<double>(), static_cast<double>(tokens)}, at::kDouble);
  KEEL_RETURN_IF_ERROR(SumOverData(totals, runtime_, "validation loss"));
  const double total_tokens = totals[1].item<double>();
  return total_tokens > 0 ? totals[0].item<double>() / total_tokens
                          : std::numeric_limits<double>::quiet_NaN();
}

absl::Status Run::OpenOutputs() {
  State& s = *state_;
  // Tensors and parameters of the whole model: each stage counts its own, a shared copy not.
  at::Tensor counts = at::zeros({2}, at::kLong);
  for (const gradients::NamedParameter& p : s.optimizer->parameters()) {
    if (p.shared) continue;
    counts[0] += 1;
    counts[1] += p.layout ? c10::multiply_integers(p.layout->global_shape) : p.param.numel();
  }
  KEEL_RETURN_IF_ERROR(SumOverStages(counts, runtime_, "the parameter count"));
  if (runtime_.rank != 0) return absl::OkStatus();
  KEEL_ASSIGN_OR_RETURN(s.jsonl,
                        JsonlWriter::Create(base::JoinPath(options_.run_dir, "metrics.jsonl"),
                                            /*append=*/resumed_));
  if (options_.logging.tensorboard) {
    KEEL_ASSIGN_OR_RETURN(
        s.tensorboard,
        TensorBoardWriter::Create(base::JoinPath(options_.run_dir, "tensorboard"), NowSeconds()));
  }
  const int tp = runtime_.mesh == nullptr ? 1 : runtime_.mesh->GroupSize(parallel::GroupKind::kTp);
  const int pp = runtime_.mesh == nullptr ? 1 : runtime_.mesh->GroupSize(parallel::GroupKind::kPp);
  *runtime_.log << "model: " << counts[0].item<int64_t>() << " tensors, "
                << counts[1].item<int64_t>() << " parameters"
                << (tp > 1 ? absl::StrCat(" (1/", tp, " of most on each tensor-parallel rank)")
                           : "")
                << (pp > 1 ? absl::StrCat(" in ", pp, " pipeline stages of ",
                                          options_.model.num_layers / pp, " blocks")
                           : "")
                << ", " << s.optimizer->Describe()
                << (UsesFusedAdamW(options_.optimizer, runtime_.device) ? " (fused step)" : "")
                << "; " << s.data.splits.train_size() << " training and "
                << s.data.splits.val_size() << " validation windows of "
                << options_.data.dataset.sequence_length << " tokens; " << s.scheduler->max_steps()
                << " steps of " << options_.step_scheduler.global_batch_size << " samples ("
                << s.scheduler->grad_acc_steps() << " micro-batches of "
                << options_.local_batch_size << " per rank on " << runtime_.dp_size
                << " rank(s))\n";
  return absl::OkStatus();
}

absl::Status Run::Record(const StepMetrics& metrics) {
  State& s = *state_;
  if (s.jsonl) KEEL_RETURN_IF_ERROR(s.jsonl->Write(metrics));
  if (!s.tensorboard) return absl::OkStatus();
  return AddStepScalars(*s.tensorboard, metrics, NowSeconds());
}

absl::Status Run::AfterStep(StepMetrics& metrics) {
  State& s = *state_;
  const bool validate = s.Bookkept([&] { return s.scheduler->IsValStep(); });
  if (validate && s.data.splits.val_size() > 0) {
    KEEL_ASSIGN_OR_RETURN(metrics.val_loss, Validate());
  }
  if (metrics.step % options_.logging.log_every_steps == 0 || validate) {
    const double seconds = Seconds(Clock::now() - s.interval_start);
    metrics.tokens_per_second = seconds > 0 ? s.interval_tokens / seconds : 0.0;
    s.interval_start = Clock::now();
    s.interval_tokens = 0;
    // Flushed: a pipe or file (tee, a job log) shows progress as it happens.
    if (runtime_.rank == 0) {
      *runtime_.log << ProgressLine(metrics, s.scheduler->max_steps(), result_.start_step)
                    << std::endl;
    }
  }
  if (runtime_.rank == 0) KEEL_RETURN_IF_ERROR(Record(metrics));
  if (!s.Bookkept([&] { return s.scheduler->IsCkptStep(); })) return absl::OkStatus();
  const scheduling::StepSchedulerState at = s.scheduler->StateDict();
  return s.checkpointer->Save(s.statefuls, at.step, at.epoch);
}

absl::Status Run::Loop() {
  State& s = *state_;
  Scheduler& scheduler = *s.scheduler;
  KEEL_RETURN_IF_ERROR(OpenOutputs());
  s.profiler.emplace(runtime_.rank == 0 ? options_.logging : LoggingOptions(), options_.run_dir,
                     runtime_.device);
  s.loop_start = s.interval_start = Clock::now();
  s.tensor_parallel_start = parallel::TensorParallelCollectiveSeconds();
  s.pipeline_wait_start = parallel::PipelineWaitSeconds();
  s.expert_dispatch_start = parallel::ExpertDispatchSeconds();
  result_.final_loss = std::numeric_limits<double>::quiet_NaN();
  for (int64_t epoch : scheduler.Epochs()) {
    scheduler.SetEpoch(epoch);
    auto it = s.Bookkept([&] { return scheduler.begin(); });
    while (it != scheduler.end()) {
      KEEL_RETURN_IF_ERROR(s.profiler->BeforeStep(scheduler.step() + 1));
      KEEL_ASSIGN_OR_RETURN(StepOutput output, Step(*it));
      StepMetrics metrics;
      metrics.step = scheduler.step() + 1;
      KEEL_RETURN_IF_ERROR(s.profiler->AfterStep(metrics.step, *runtime_.log));
      metrics.epoch = scheduler.epoch();
      metrics.loss = output.loss;
      metrics.lr = output.lr;
      metrics.grad_norm = output.grad_norm;
      metrics.moe_aux_loss = output.moe_aux_loss;
      metrics.tokens_per_expert = output.tokens_per_expert;
      if (options_.numerics.on_nonfinite == NonFinitePolicy::kSkip) {
        metrics.skipped_steps = s.numerics->state().skipped_steps;
      }
      s.interval_tokens += output.label_tokens;
      metrics.elapsed_seconds = Seconds(Clock::now() - s.loop_start);
      result_.final_loss = metrics.loss;
      KEEL_RETURN_IF_ERROR(AfterStep(metrics));
      s.Bookkept([&] { ++it; });
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> Run::Finish() {
  State& s = *state_;
  KEEL_RETURN_IF_ERROR(s.checkpointer->Wait());
  KEEL_RETURN_IF_ERROR(s.scheduler->preemption_status());
  result_.preempted = s.scheduler->SigtermReceived();
  result_.final_step = s.scheduler->step();
  result_.loop_seconds = Seconds(Clock::now() - s.loop_start);
  result_.bookkeeping_seconds = Seconds(s.bookkeeping);
  result_.gradient_wait_seconds = Seconds(s.gradient_wait);
  result_.tensor_parallel_seconds =
      parallel::TensorParallelCollectiveSeconds() - s.tensor_parallel_start;
  result_.pipeline_wait_seconds = parallel::PipelineWaitSeconds() - s.pipeline_wait_start;
  result_.expert_dispatch_seconds = parallel::ExpertDispatchSeconds() - s.expert_dispatch_start;
  if (runtime_.rank != 0) return result_;
  std::ostream& log = *runtime_.log;
  if (s.checkpointer->last_saved()) log << "checkpoint: " << *s.checkpointer->last_saved() << "\n";
  if (s.tensorboard) KEEL_RETURN_IF_ERROR(s.tensorboard->Flush());
  KEEL_ASSIGN_OR_RETURN(std::vector<StepMetrics> history,
                        ReadJsonl(base::JoinPath(options_.run_dir, "metrics.jsonl")));
  KEEL_RETURN_IF_ERROR(WriteLossPlot(base::JoinPath(options_.run_dir, "loss.svg"), history));
  log << (result_.preempted ? "preempted" : "done") << " at step " << result_.final_step
      << "; bookkeeping " << 100.0 * result_.bookkeeping_seconds / result_.loop_seconds << "% of "
      << result_.loop_seconds << " s; waiting for gradients "
      << 100.0 * result_.gradient_wait_seconds / result_.loop_seconds << "%";
  if (result_.tensor_parallel_seconds > 0) {
    log << "; tensor-parallel collectives "
        << 100.0 * result_.tensor_parallel_seconds / result_.loop_seconds << "%";
  }
  if (result_.expert_dispatch_seconds > 0) {
    log << "; expert dispatch " << 100.0 * result_.expert_dispatch_seconds / result_.loop_seconds
        << "%";
  }
  if (result_.pipeline_wait_seconds > 0) {
    log << "; pipeline waits " << 100.0 * result_.pipeline_wait_seconds / result_.loop_seconds
        << "%";
  }
  // On a GPU these are the host's times: collectives are queued there, not waited for.
  if (runtime_.device.is_cuda()) log << " (host times: the device runs asynchronously)";
  log << "\n";
  return result_;
}

absl::StatusOr<TrainResult> Train(const TrainOptions& options, TrainRuntime runtime) {
  // One run per run directory: rank 0 locks it before anything reads or writes there.
  std::optional<RunDirLock> lock;
  absl::Status locked;
  if (runtime.rank == 0) {
    absl::StatusOr<RunDirLock> acquired = RunDirLock::Acquire(options.run_dir);
    locked = acquired.status();
    if (acquired.ok()) lock.emplace(*std::move(acquired));
  }
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(locked, runtime, "locking the run directory"));
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, Run::Build(options, std::move(runtime)));
  KEEL_RETURN_IF_ERROR(run->Resume().status());
  KEEL_RETURN_IF_ERROR(run->Loop());
  return run->Finish();
}

}  // namespace keel::tools::recipe
