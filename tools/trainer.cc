#include "tools/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/model_state.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/training_state.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/dp_sync.h"
#include "optim/param_scheduler.h"
#include "sampling/gpt_dataset.h"
#include "sampling/indexed_dataset.h"
#include "sampling/megatron_sampler.h"
#include "scheduling/step_scheduler.h"
#include "tools/corpus.h"
#include "tools/gpt.h"
#include "tools/metrics.h"
#include "tools/train_config.h"
#include "torch/optim/adamw.h"
#include "torch/utils.h"

namespace keel::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

absl::Status MakeDirectories(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error)
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", error.message()));
  return absl::OkStatus();
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

absl::Status Require(bool ok, absl::string_view field, int64_t value, absl::string_view allowed) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " (", value, ") ", allowed));
}

// The GPT windows split into training and validation samples: with n =
// data.validation_every_n_samples, every n-th sample validates (none for n = 0).
class Splits {
 public:
  Splits(sampling::GptDataset dataset, int64_t every_n)
      : dataset_(std::move(dataset)), every_n_(every_n) {}

  int64_t train_size() const { return dataset_.size() - val_size(); }
  int64_t val_size() const { return every_n_ == 0 ? 0 : dataset_.size() / every_n_; }

  // Samples [count, sequence_length + 1] for the given split indices (negative ones, padding,
  // are skipped).
  absl::StatusOr<at::Tensor> Batch(const std::vector<int64_t>& indices, bool validation) const {
    std::vector<at::Tensor> samples;
    for (int64_t index : indices) {
      if (index < 0) continue;
      KEEL_ASSIGN_OR_RETURN(at::Tensor sample,
                            dataset_.Sample(validation ? ValIndex(index) : TrainIndex(index)));
      samples.push_back(std::move(sample));
    }
    if (samples.empty()) return at::Tensor();
    return at::stack(samples);
  }

 private:
  int64_t TrainIndex(int64_t j) const {
    return every_n_ == 0 ? j : (j / (every_n_ - 1)) * every_n_ + j % (every_n_ - 1);
  }
  int64_t ValIndex(int64_t k) const { return k * every_n_ + every_n_ - 1; }

  sampling::GptDataset dataset_;
  int64_t every_n_;
};

// Rank 0 prepares the default corpus (if missing) while the others wait for its status.
absl::StatusOr<std::string> DataPrefix(const TrainConfig& config, const TrainRuntime& runtime,
                                       std::ostream& log) {
  if (!config.data().prefix().empty()) return config.data().prefix();
  const std::string prefix = absl::StrCat(config.run_dir(), "/data/corpus");
  absl::Status prepared;
  if (runtime.rank == 0 && !sampling::IndexedDataset::Open(prefix).ok()) {
    const std::vector<std::string> files = DefaultCorpusFiles();
    if (files.empty()) {
      prepared = absl::NotFoundError(
          "the default corpus (/usr/share/common-licenses, from Debian's base-files) is "
          "missing; set data.prefix to a Megatron indexed dataset");
    } else {
      prepared = MakeDirectories(absl::StrCat(config.run_dir(), "/data"));
      if (prepared.ok()) {
        absl::StatusOr<CorpusStats> stats = BuildByteCorpus(files, prefix);
        prepared = stats.status();
        if (stats.ok()) {
          log << "data: default corpus, " << files.size() << " files from "
              << "/usr/share/common-licenses, " << stats->tokens << " byte tokens -> " << prefix
              << "\n";
        }
      }
    }
  }
  if (runtime.control_group != nullptr) {
    at::Tensor failed = at::full({1}, prepared.ok() ? 0 : 1, at::kInt);
    KEEL_RETURN_IF_ERROR(
        base::AllReduce(failed, base::Reduce::kMax, *runtime.control_group, "corpus preparation"));
    if (prepared.ok() && failed.item<int>() != 0) {
      return absl::UnavailableError("rank 0 failed to prepare the default corpus");
    }
  }
  KEEL_RETURN_IF_ERROR(prepared);
  return prefix;
}

// Sum over the group (identity for a single process).
absl::Status SumOverRanks(at::Tensor& tensor, const TrainRuntime& runtime, absl::string_view what) {
  if (runtime.control_group == nullptr) return absl::OkStatus();
  return base::AllReduce(tensor, base::Reduce::kSum, *runtime.control_group, what);
}

// Mean validation loss per label token over the whole validation split, shared by the ranks.
absl::StatusOr<double> Validate(Gpt& model, const Splits& splits, int64_t batch_size,
                                const TrainRuntime& runtime) {
  at::NoGradGuard no_grad;
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t start = runtime.rank * batch_size; start < splits.val_size();
       start += runtime.world_size * batch_size) {
    std::vector<int64_t> indices;
    for (int64_t k = start; k < std::min(start + batch_size, splits.val_size()); ++k) {
      indices.push_back(k);
    }
    KEEL_ASSIGN_OR_RETURN(at::Tensor batch, splits.Batch(indices, /*validation=*/true));
    batch = batch.to(runtime.device);
    const at::Tensor logits = model->forward(batch.slice(1, 0, -1));
    loss_sum += at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                       batch.slice(1, 1).reshape({-1}), {}, at::Reduction::Sum)
                    .item<double>();
    tokens += batch.size(0) * (batch.size(1) - 1);
  }
  at::Tensor totals = at::tensor({loss_sum, static_cast<double>(tokens)}, at::kDouble);
  KEEL_RETURN_IF_ERROR(SumOverRanks(totals, runtime, "validation loss"));
  const double total_tokens = totals[1].item<double>();
  return total_tokens > 0 ? totals[0].item<double>() / total_tokens
                          : std::numeric_limits<double>::quiet_NaN();
}

// Rank 0's run outputs.
struct Outputs {
  std::optional<JsonlWriter> jsonl;
  std::optional<TensorBoardWriter> tensorboard;
};

absl::Status Record(Outputs& outputs, const StepMetrics& metrics) {
  if (outputs.jsonl) KEEL_RETURN_IF_ERROR(outputs.jsonl->Write(metrics));
  if (outputs.tensorboard) {
    const double now = NowSeconds();
    KEEL_RETURN_IF_ERROR(
        outputs.tensorboard->AddScalar("train/loss", metrics.step, metrics.loss, now));
    KEEL_RETURN_IF_ERROR(outputs.tensorboard->AddScalar("train/lr", metrics.step, metrics.lr, now));
    KEEL_RETURN_IF_ERROR(
        outputs.tensorboard->AddScalar("train/grad_norm", metrics.step, metrics.grad_norm, now));
    if (metrics.val_loss) {
      KEEL_RETURN_IF_ERROR(
          outputs.tensorboard->AddScalar("val/loss", metrics.step, *metrics.val_loss, now));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainConfig& config, TrainRuntime runtime) {
  std::ostream& log = *runtime.log;
  const bool chief = runtime.rank == 0;
  if (config.run_dir().empty()) return absl::InvalidArgumentError("run_dir must be set");
  KEEL_RETURN_IF_ERROR(MakeDirectories(config.run_dir()));

  // Options of every component, copied from the config by field name.
  scheduling::StepSchedulerOptions step_options;
  KEEL_RETURN_IF_ERROR(CopyFields(config.step_scheduler(), step_options));
  const int64_t local_batch_size = config.step_scheduler().local_batch_size();
  KEEL_RETURN_IF_ERROR(Require(local_batch_size > 0, "step_scheduler.local_batch_size",
                               local_batch_size, "must be > 0"));
  sampling::GptDatasetOptions data_options;
  KEEL_RETURN_IF_ERROR(CopyFields(config.data(), data_options));
  const int64_t every_n = config.data().validation_every_n_samples();
  KEEL_RETURN_IF_ERROR(Require(every_n == 0 || every_n >= 2, "data.validation_every_n_samples",
                               every_n, "must be 0 (no validation) or >= 2"));
  sampling::MegatronSamplerOptions sampler_options;
  KEEL_RETURN_IF_ERROR(
      CopyFields(config.sampler(), sampler_options, {"micro_batch_size", "global_batch_size"}));
  sampler_options.micro_batch_size = local_batch_size;
  sampler_options.global_batch_size = step_options.global_batch_size;
  GptOptions model_options;
  KEEL_RETURN_IF_ERROR(CopyFields(config.model(), model_options));
  model_options.max_sequence_length = data_options.sequence_length;
  for (auto [field, value] : {std::pair{"model.vocab_size", model_options.vocab_size},
                              {"model.hidden_size", model_options.hidden_size},
                              {"model.num_layers", model_options.num_layers},
                              {"model.num_attention_heads", model_options.num_attention_heads},
                              {"model.ffn_hidden_size", model_options.ffn_hidden_size}}) {
    KEEL_RETURN_IF_ERROR(Require(value > 0, field, value, "must be > 0"));
  }
  KEEL_RETURN_IF_ERROR(Require(model_options.hidden_size % model_options.num_attention_heads == 0,
                               "model.hidden_size", model_options.hidden_size,
                               absl::StrCat("must be divisible by model.num_attention_heads (",
                                            model_options.num_attention_heads, ")")));
  optim::ParamSchedulerOptions lr_options;
  KEEL_RETURN_IF_ERROR(CopyFields(config.lr_scheduler(), lr_options));
  checkpoint::CheckpointerOptions checkpoint_options;
  checkpoint_options.checkpoint_dir = absl::StrCat(config.run_dir(), "/checkpoints");
  KEEL_RETURN_IF_ERROR(CopyFields(config.checkpoint(), checkpoint_options));
  if (config.optimizer().has_name() && config.optimizer().name() != "AdamW") {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.name \"", config.optimizer().name(),
                                                   "\" is not supported; allowed: \"AdamW\""));
  }

  // Data: GPT windows of a Megatron indexed dataset, a Megatron sampler over the training split.
  KEEL_ASSIGN_OR_RETURN(const std::string prefix, DataPrefix(config, runtime, log));
  KEEL_ASSIGN_OR_RETURN(sampling::IndexedDataset tokens, sampling::IndexedDataset::Open(prefix));
  KEEL_ASSIGN_OR_RETURN(sampling::GptDataset windows,
                        sampling::GptDataset::Create(std::move(tokens), data_options));
  const Splits splits(std::move(windows), every_n);
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<sampling::MegatronSampler> sampler,
                        sampling::CreateMegatronSampler(sampler_options, splits.train_size(),
                                                        runtime.rank, runtime.world_size));
  KEEL_ASSIGN_OR_RETURN(
      auto scheduler,
      scheduling::BuildStepScheduler(step_options, *sampler, runtime.world_size, local_batch_size,
                                     runtime.control_group, std::move(runtime.preemption)));

  // Model (initialised on the CPU from the default generator, seeded here, so every device
  // starts from the same weights), optimizer, LR schedule.
  torch::manual_seed(config.has_seed() ? config.seed() : 0);
  Gpt model(model_options);
  model->to(runtime.device);
  std::vector<gradients::NamedParameter> parameters = gradients::TrainableParameters({model.get()});
  std::vector<at::Tensor> tensors;
  for (const auto& parameter : parameters) tensors.push_back(parameter.param);
  torch::optim::AdamWOptions adamw_options(config.optimizer().has_lr() ? config.optimizer().lr()
                                                                       : 1e-3);
  if (config.optimizer().has_beta1() || config.optimizer().has_beta2()) {
    adamw_options.betas({config.optimizer().has_beta1() ? config.optimizer().beta1() : 0.9,
                         config.optimizer().has_beta2() ? config.optimizer().beta2() : 0.999});
  }
  if (config.optimizer().has_eps()) adamw_options.eps(config.optimizer().eps());
  if (config.optimizer().has_weight_decay()) {
    adamw_options.weight_decay(config.optimizer().weight_decay());
  }
  torch::optim::AdamW optimizer(tensors, adamw_options);
  KEEL_ASSIGN_OR_RETURN(optim::ParamScheduler lr_scheduler,
                        optim::ParamScheduler::Create(lr_options, optimizer));
  std::unique_ptr<gradients::DataParallelGradSync> dp_sync;
  if (runtime.group != nullptr) {
    KEEL_ASSIGN_OR_RETURN(dp_sync, gradients::DataParallelGradSync::Create(*model, *runtime.group));
  }

  // Everything a checkpoint holds, and the resume from the newest valid one.
  checkpoint::ModelStateOptions model_state_options;
  model_state_options.model_save_format = checkpoint_options.model_save_format;
  checkpoint::ModelState model_state(*model, model_state_options);
  KEEL_ASSIGN_OR_RETURN(checkpoint::OptimizerState optim_state,
                        checkpoint::OptimizerState::Create(*model, optimizer, &lr_scheduler));
  checkpoint::ValueState<scheduling::StepSchedulerState> step_state(
      [&] { return scheduler.StateDict(); },
      [&](const scheduling::StepSchedulerState& state) { return scheduler.LoadStateDict(state); });
  checkpoint::ValueState<sampling::MegatronSamplerState> sampler_state(
      [&] { return sampler->State(); },
      [&](const sampling::MegatronSamplerState& state) { return sampler->LoadState(state); });
  checkpoint::RngState rng_state(runtime.rank, runtime.world_size);
  const checkpoint::Statefuls statefuls = {{"model", &model_state},
                                           {"optim", &optim_state},
                                           {"rng", &rng_state},
                                           {"sampler", &sampler_state},
                                           {"step_scheduler", &step_state}};
  KEEL_ASSIGN_OR_RETURN(auto checkpointer, checkpoint::Checkpointer::Create(
                                               checkpoint_options, runtime.checkpoint_group));
  KEEL_RETURN_IF_ERROR(MakeDirectories(checkpoint_options.checkpoint_dir));
  KEEL_ASSIGN_OR_RETURN(checkpoint::FindResult found,
                        checkpoint::FindLatest(checkpoint_options.checkpoint_dir));
  if (chief) {
    for (const std::string& warning : found.warnings) log << "warning: " << warning << "\n";
  }
  if (found.latest) {
    KEEL_RETURN_IF_ERROR(checkpointer->Load(found.latest->path, statefuls).status());
    if (chief) log << "resumed from " << found.latest->path << "\n";
  }

  TrainResult result;
  result.start_step = scheduler.step();
  Outputs outputs;
  if (chief) {
    KEEL_ASSIGN_OR_RETURN(outputs.jsonl,
                          JsonlWriter::Create(absl::StrCat(config.run_dir(), "/metrics.jsonl"),
                                              /*append=*/found.latest.has_value()));
    if (!config.logging().has_tensorboard() || config.logging().tensorboard()) {
      KEEL_ASSIGN_OR_RETURN(
          outputs.tensorboard,
          TensorBoardWriter::Create(absl::StrCat(config.run_dir(), "/tensorboard"), NowSeconds()));
    }
    log << "model: " << parameters.size() << " tensors, " <<
        [&] {
          int64_t n = 0;
          for (const auto& p : parameters) n += p.param.numel();
          return n;
        }()
        << " parameters; " << splits.train_size() << " training and " << splits.val_size()
        << " validation windows of " << data_options.sequence_length << " tokens; "
        << scheduler.max_steps() << " steps of " << step_options.global_batch_size << " samples ("
        << scheduler.grad_acc_steps() << " micro-batches of " << local_batch_size << " per rank on "
        << runtime.world_size << " rank(s))\n";
  }

  const int64_t log_every =
      config.logging().has_log_every_steps() ? config.logging().log_every_steps() : 1;
  const std::optional<double> max_norm = config.clip_grad().has_max_norm()
                                             ? std::optional<double>(config.clip_grad().max_norm())
                                             : std::numeric_limits<double>::infinity();
  const auto loop_start = Clock::now();
  Clock::duration bookkeeping{};
  auto interval_start = loop_start;
  int64_t interval_tokens = 0;
  result.final_loss = std::numeric_limits<double>::quiet_NaN();

  for (int64_t epoch : scheduler.Epochs()) {
    scheduler.SetEpoch(epoch);
    auto book = Clock::now();
    auto it = scheduler.begin();
    bookkeeping += Clock::now() - book;
    while (it != scheduler.end()) {
      const auto& micro_batches = *it;
      // Label tokens of the global batch: the loss is their mean, however the batch is split.
      std::vector<at::Tensor> batches;
      int64_t local_tokens = 0;
      for (const std::vector<int64_t>& indices : micro_batches) {
        KEEL_ASSIGN_OR_RETURN(at::Tensor batch, splits.Batch(indices, /*validation=*/false));
        if (batch.defined()) {
          batch = batch.to(runtime.device);
          local_tokens += batch.size(0) * (batch.size(1) - 1);
        }
        batches.push_back(std::move(batch));
      }
      at::Tensor global_tokens = at::full({1}, local_tokens, at::kLong);
      KEEL_RETURN_IF_ERROR(SumOverRanks(global_tokens, runtime, "label-token count"));
      const double label_tokens = static_cast<double>(global_tokens.item<int64_t>());

      const double lr = lr_scheduler.GetLr();
      if (dp_sync) dp_sync->PrepareForGradAccumulation();
      double loss_sum = 0.0;
      for (size_t i = 0; i < batches.size(); ++i) {
        if (dp_sync && i + 1 == batches.size()) dp_sync->PrepareForFinalBackward();
        if (!batches[i].defined()) continue;
        const at::Tensor logits = model->forward(batches[i].slice(1, 0, -1));
        const at::Tensor loss =
            at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                   batches[i].slice(1, 1).reshape({-1}), {}, at::Reduction::Sum);
        loss_sum += loss.item<double>();
        // Gradients are averaged over the ranks: scale so they sum to d(mean loss).
        (loss * (static_cast<double>(runtime.world_size) / label_tokens)).backward();
      }
      if (dp_sync) KEEL_RETURN_IF_ERROR(dp_sync->Wait());
      KEEL_ASSIGN_OR_RETURN(at::Tensor grad_norm, gradients::ClipGradNorm(max_norm, parameters));
      optimizer.step();
      optimizer.zero_grad();
      book = Clock::now();
      lr_scheduler.Step(1);
      bookkeeping += Clock::now() - book;

      at::Tensor step_loss = at::full({1}, loss_sum, at::kDouble);
      KEEL_RETURN_IF_ERROR(SumOverRanks(step_loss, runtime, "step loss"));
      StepMetrics metrics;
      metrics.step = scheduler.step() + 1;
      metrics.epoch = scheduler.epoch();
      metrics.loss = step_loss.item<double>() / label_tokens;
      metrics.lr = lr;
      metrics.grad_norm = grad_norm.item<double>();
      interval_tokens += static_cast<int64_t>(label_tokens);
      metrics.elapsed_seconds = Seconds(Clock::now() - loop_start);
      result.final_loss = metrics.loss;

      book = Clock::now();
      const bool validate = scheduler.IsValStep();
      bookkeeping += Clock::now() - book;
      if (validate && splits.val_size() > 0) {
        KEEL_ASSIGN_OR_RETURN(metrics.val_loss, Validate(model, splits, local_batch_size, runtime));
      }
      const bool log_now = metrics.step % log_every == 0 || validate;
      if (log_now) {
        const double seconds = Seconds(Clock::now() - interval_start);
        metrics.tokens_per_second = seconds > 0 ? interval_tokens / seconds : 0.0;
        interval_start = Clock::now();
        interval_tokens = 0;
        // Flushed: a pipe or file (tee, a job log) shows progress as it happens.
        if (chief)
          log << ProgressLine(metrics, scheduler.max_steps(), result.start_step) << std::endl;
      }
      if (chief) KEEL_RETURN_IF_ERROR(Record(outputs, metrics));

      book = Clock::now();
      const bool save = scheduler.IsCkptStep();
      bookkeeping += Clock::now() - book;
      if (save) {
        KEEL_RETURN_IF_ERROR(
            checkpointer->Save(statefuls, scheduler.StateDict().step, scheduler.epoch()));
      }
      book = Clock::now();
      ++it;
      bookkeeping += Clock::now() - book;
    }
  }
  KEEL_RETURN_IF_ERROR(checkpointer->Wait());
  KEEL_RETURN_IF_ERROR(scheduler.preemption_status());
  result.preempted = scheduler.SigtermReceived();
  result.final_step = scheduler.step();
  result.loop_seconds = Seconds(Clock::now() - loop_start);
  result.bookkeeping_seconds = Seconds(bookkeeping);
  if (chief) {
    if (checkpointer->last_saved()) log << "checkpoint: " << *checkpointer->last_saved() << "\n";
    if (outputs.tensorboard) KEEL_RETURN_IF_ERROR(outputs.tensorboard->Flush());
    KEEL_ASSIGN_OR_RETURN(std::vector<StepMetrics> history,
                          ReadJsonl(absl::StrCat(config.run_dir(), "/metrics.jsonl")));
    KEEL_RETURN_IF_ERROR(WriteLossPlot(absl::StrCat(config.run_dir(), "/loss.svg"), history));
    log << (result.preempted ? "preempted" : "done") << " at step " << result.final_step
        << "; bookkeeping " << 100.0 * result.bookkeeping_seconds / result.loop_seconds << "% of "
        << result.loop_seconds << " s\n";
  }
  return result;
}

}  // namespace keel::tools
