#include "tools/recipe/dry_run.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status.h"
#include "models/registry.h"
#include "optim/param_scheduler.h"
#include "parallel/mesh_layout.h"
#include "parallel/parameters.h"
#include "peft/module_matcher.h"
#include "sampling/indexed_dataset.h"
#include "scheduling/preemption.h"
#include "scheduling/step_scheduler.h"
#include "tools/recipe/data.h"
#include "tools/recipe/lr_schedule.h"
#include "tools/recipe/memory.h"
#include "tools/recipe/plot.h"
#include "torch/optim/adamw.h"
#include "torch/types.h"

namespace keel::tools::recipe {
namespace {

// Checkpoint steps listed with their learning rate beyond this many: the first and last halves.
constexpr size_t kListedCheckpoints = 10;

// The walk never sees a preemption, and installs no signal handlers.
class NeverPreempted final : public scheduling::PreemptionFlag {
 public:
  bool Received() const override { return false; }
};

// A directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class ScratchDirectory {
 public:
  static absl::StatusOr<ScratchDirectory> Create() {
    const char* tmp = getenv("TMPDIR");
    std::string path =
        base::JoinPath(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "keel-dry-run.XXXXXX");
    if (mkdtemp(path.data()) == nullptr) return base::ErrnoError("mkdtemp", path);
    return ScratchDirectory(std::move(path));
  }
  ScratchDirectory(ScratchDirectory&& other) : path_(std::exchange(other.path_, "")) {}
  ScratchDirectory& operator=(ScratchDirectory&&) = delete;
  ~ScratchDirectory() {
    if (!path_.empty()) base::RemoveTree(path_).IgnoreError();
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDirectory(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// The data the run would train on. The default corpus that the run has not prepared yet is
// prepared in `scratch` instead of <run_dir>/data (a few hundred kilobytes, under a second).
absl::StatusOr<TrainData> OpenData(TrainOptions options, int world_size, const std::string& scratch,
                                   std::ostream& out) {
  if (options.data.prefix.empty()) {
    const std::string prepared = base::JoinPath(options.run_dir, "data/corpus");
    if (sampling::IndexedDataset::Open(prepared).ok()) {
      options.data.prefix = prepared;
    } else {
      options.run_dir = scratch;
    }
  }
  TrainRuntime runtime;
  runtime.world_size = world_size;
  runtime.dp_size = world_size;
  std::ostringstream preparation;  // its notice names the scratch copy
  runtime.log = &preparation;
  return OpenTrainData(options, runtime, /*plan_only=*/true);
}

// What the StepScheduler decides at each step of the run (steps numbered from 1).
struct ScheduleWalk {
  int64_t steps = 0;
  // TotalSteps: what the learning-rate schedule's derived step counts measure.
  int64_t total_steps = 0;
  int64_t epochs = 0;
  int64_t grad_acc_steps = 0;
  int64_t steps_per_epoch = 0;
  int64_t samples = 0;
  std::vector<int64_t> checkpoints;
  std::vector<int64_t> validations;
  std::vector<int64_t> gcs;
};

// Walks the StepScheduler over rank 0's sampler as Run::Loop and Run::AfterStep do: the
// validation flag, then the checkpoint flag, after each step.
absl::StatusOr<ScheduleWalk> WalkSchedule(const TrainOptions& options, int world_size,
                                          TrainData& data) {
  auto built = scheduling::BuildStepScheduler(options.step_scheduler, *data.sampler, world_size,
                                              options.local_batch_size, nullptr,
                                              std::make_unique<NeverPreempted>());
  KEEL_RETURN_IF_ERROR(base::Annotate(built.status(), "step_scheduler"));
  auto& scheduler = *built;
  KEEL_RETURN_IF_ERROR(CheckStepsLeft(scheduler.step(), scheduler.epoch(), scheduler.max_steps(),
                                      scheduler.num_epochs()));
  ScheduleWalk walk;
  walk.grad_acc_steps = scheduler.grad_acc_steps();
  // NeMo's epoch length, in steps: what num_epochs multiplies into the cap on max_steps.
  walk.steps_per_epoch = scheduler.epoch_len().value_or(0);
  walk.total_steps =
      TotalSteps(scheduler.max_steps(), scheduler.epoch_len(), scheduler.num_epochs());
  for (int64_t epoch : scheduler.Epochs()) {
    scheduler.SetEpoch(epoch);
    ++walk.epochs;
    for (auto it = scheduler.begin(); it != scheduler.end(); ++it) {
      const int64_t step = scheduler.step() + 1;
      for (const std::vector<int64_t>& micro_batch : *it) {
        walk.samples += world_size * std::count_if(micro_batch.begin(), micro_batch.end(),
                                                   [](int64_t i) { return i >= 0; });
      }
      if (scheduler.IsValStep() && data.splits.val_size() > 0) walk.validations.push_back(step);
      if (scheduler.IsCkptStep()) walk.checkpoints.push_back(step);
      if (scheduler.IsGcStep()) walk.gcs.push_back(step);
      walk.steps = step;
    }
  }
  return walk;
}

// The learning rate and weight decay each step trains with (entry k - 1 for step k).
struct LrWd {
  std::vector<double> lr;
  std::vector<double> wd;
};

absl::StatusOr<LrWd> WalkLrWd(const optim::ParamSchedulerOptions& options, int64_t steps) {
  torch::optim::AdamW optimizer(std::vector<at::Tensor>{torch::zeros({1})});
  absl::StatusOr<optim::ParamScheduler> created = optim::ParamScheduler::Create(options, optimizer);
  KEEL_RETURN_IF_ERROR(base::Annotate(created.status(), "lr_scheduler"));
  optim::ParamScheduler& scheduler = *created;
  LrWd values;
  for (int64_t step = 1; step <= steps; ++step) {
    values.lr.push_back(scheduler.GetLr());
    values.wd.push_back(scheduler.GetWd());
    KEEL_RETURN_IF_ERROR(scheduler.Step(1));
  }
  return values;
}

// "step 21 (warm-up end): lr 0.003, wd 0.01" lines for the first, warm-up-end, checkpoint and
// last steps (of many checkpoints, the first and last few).
void PrintLrWd(const ScheduleWalk& walk, const LrWd& values, int64_t warmup, std::ostream& out) {
  std::vector<std::pair<int64_t, std::string>> marks = {{1, "first"}};
  if (warmup > 0 && warmup + 1 <= walk.steps) marks.emplace_back(warmup + 1, "warm-up end");
  const size_t n = walk.checkpoints.size();
  const size_t skipped = n > kListedCheckpoints ? n - kListedCheckpoints : 0;
  for (size_t i = 0; i < n; ++i) {
    if (i < kListedCheckpoints / 2 || i >= kListedCheckpoints / 2 + skipped) {
      marks.emplace_back(walk.checkpoints[i], "checkpoint");
    }
  }
  marks.emplace_back(walk.steps, "last");
  std::stable_sort(marks.begin(), marks.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < marks.size();) {
    const int64_t step = marks[i].first;
    std::vector<std::string> labels;
    for (; i < marks.size() && marks[i].first == step; ++i) labels.push_back(marks[i].second);
    out << "  step " << step << " (" << absl::StrJoin(labels, ", ") << "): lr "
        << values.lr[step - 1] << ", wd " << values.wd[step - 1] << "\n";
  }
  if (skipped > 0) out << "  (" << skipped << " more checkpoint steps not listed)\n";
}

// The schedule plot: the learning rate with checkpoint and validation marks, the weight decay.
absl::Status WriteSchedulePlot(const std::string& path, const ScheduleWalk& walk,
                               const LrWd& values) {
  Plot plot{"Schedule (dry run)", "step", {}, {}};
  std::vector<std::optional<double>> lr, wd, checkpoints(walk.steps), validations(walk.steps);
  for (int64_t step = 1; step <= walk.steps; ++step) {
    plot.x.push_back(static_cast<double>(step));
    lr.push_back(values.lr[step - 1]);
    wd.push_back(values.wd[step - 1]);
  }
  for (int64_t step : walk.checkpoints) checkpoints[step - 1] = values.lr[step - 1];
  for (int64_t step : walk.validations) validations[step - 1] = values.lr[step - 1];
  PlotPanel lr_panel{"learning rate", 150, {{"lr", "lr", "#2ca02c", lr}}};
  lr_panel.series.push_back({"checkpoint", "ckpt", "#d62728", checkpoints, /*markers=*/true});
  lr_panel.series.push_back({"validation", "val", "#1f77b4", validations, /*markers=*/true});
  plot.panels = {lr_panel, {"weight decay", 100, {{"wd", "wd", "#9467bd", wd}}}};
  return WritePlot(path, plot);
}

// The warnings a user would want before a long run.
void PrintWarnings(const TrainOptions& options, const ScheduleWalk& walk, const Splits& splits,
                   std::ostream& out) {
  const scheduling::StepSchedulerOptions& o = options.step_scheduler;
  if (o.max_steps.has_value() && walk.steps < *o.max_steps && walk.steps_per_epoch > 0) {
    out << "warning: num_epochs (" << o.num_epochs.value_or(0) << ") stops the run at step "
        << walk.steps << " (" << walk.steps_per_epoch << " steps per epoch), before max_steps ("
        << *o.max_steps << "); set step_scheduler.num_epochs to at least "
        << (*o.max_steps + walk.steps_per_epoch - 1) / walk.steps_per_epoch << " to reach it\n";
  }
  if (o.ckpt_every_steps.has_value() && *o.ckpt_every_steps > walk.steps) {
    out << "warning: step_scheduler.ckpt_every_steps (" << *o.ckpt_every_steps
        << ") never fires in " << walk.steps
        << " steps: checkpoints come only from epoch ends and the last step\n";
  }
  if (o.val_every_steps.has_value() && *o.val_every_steps > walk.steps) {
    out << "warning: step_scheduler.val_every_steps (" << *o.val_every_steps << ") never fires in "
        << walk.steps << " steps\n";
  }
  if (splits.val_size() == 0 && (o.val_every_steps.has_value() || o.validate_on_checkpoint)) {
    out << "warning: validation never runs: no validation windows "
        << (splits.megatron() != nullptr
                ? absl::StrCat("(data.split \"", options.data.megatron.split, "\")")
                : absl::StrCat("(data.validation_every_n_samples ",
                               options.data.validation_every_n_samples, ")"))
        << "\n";
  }
}

void PrintSchedule(const TrainOptions& options, int world_size, const TrainData& data,
                   const ScheduleWalk& walk, std::ostream& out) {
  const SampleShape shape = ShapeOf(options, data.splits);
  const int64_t global = options.step_scheduler.global_batch_size;
  if (data.splits.megatron() != nullptr) data.splits.megatron()->Describe(out);
  const std::string source =
      data.splits.megatron() != nullptr ? "data.paths \"" + data.prefix + "\""
      : options.data.prefix.empty() && !absl::StartsWith(data.prefix, options.run_dir)
          ? "the default corpus (counted in a temporary copy; the run prepares it in " +
                base::JoinPath(options.run_dir, "data/corpus") + ")"
          : data.prefix;
  out << "data: " << source << ": " << data.splits.train_size() << " training " << shape.noun
      << " (" << SampledWindows(options, data.splits) << " sampled) and " << data.splits.val_size()
      << " validation " << shape.noun << " of " << shape.tokens << " tokens\n"
      << "steps: " << walk.steps << " over " << walk.epochs << " epoch(s) of "
      << walk.steps_per_epoch << " steps (max_steps "
      << (options.step_scheduler.max_steps ? absl::StrCat(*options.step_scheduler.max_steps)
                                           : std::string("unset"))
      << ", num_epochs " << options.step_scheduler.num_epochs.value_or(0) << ")\n"
      << "each step: " << global << " samples, " << global * shape.tokens << " tokens; "
      << walk.grad_acc_steps << " micro-batch(es) of " << options.local_batch_size
      << " per rank on " << world_size << " rank(s)\n"
      << "in total: " << walk.samples << " samples, " << walk.samples * shape.tokens << " tokens\n"
      << "checkpoint steps: " << CompressSteps(walk.checkpoints) << "\n"
      << "validation steps: " << CompressSteps(walk.validations) << "\n"
      << "gc steps: " << CompressSteps(walk.gcs) << "\n";
}

// The layout as Megatron's initialize_model_parallel builds it: the sizes, then every kind of
// group with more than one rank, as lists of global ranks.
void PrintLayout(const parallel::MeshLayout& layout, std::ostream& out) {
  const parallel::ModelParallelOptions& p = layout.options();
  out << "layout: " << layout.world_size() << " rank(s), order " << p.order << ": tp "
      << p.tensor_model_parallel_size << ", pp " << p.pipeline_model_parallel_size << ", cp "
      << p.context_parallel_size << ", dp " << layout.data_parallel_size() << "; ep "
      << p.expert_model_parallel_size << ", expert tp " << layout.expert_tensor_parallel_size()
      << ", expert dp " << layout.expert_data_parallel_size() << "\n";
  bool any = false;
  for (parallel::GroupKind kind : parallel::kGroupKinds) {
    const std::vector<std::vector<int>>& groups = layout.Groups(kind);
    if (groups.empty() || groups.front().size() < 2) continue;
    std::vector<std::string> lists;
    for (const std::vector<int>& group : groups) {
      lists.push_back(absl::StrCat("[", absl::StrJoin(group, ", "), "]"));
    }
    out << "  " << parallel::GroupKindName(kind) << " groups: " << absl::StrJoin(lists, " ")
        << "\n";
    any = true;
  }
  if (!any) out << "  every group is a single rank\n";
}

// peft: the linear layers that get adapters (with their number where only a layer index
// differs), and the parameters that train and that stay frozen, counted on the one-rank model
// built on the meta device.
absl::Status PrintPeft(const TrainOptions& options, std::ostream& out) {
  if (!options.peft.has_value()) return absl::OkStatus();
  const peft::LoraOptions& lora = *options.peft;
  std::shared_ptr<models::LanguageModel> model;
  {
    const parallel::MetaParameters meta;
    model = models::BuildLanguageModel(options.model, {});
  }
  KEEL_ASSIGN_OR_RETURN(const std::vector<peft::LinearModule> adapted,
                        peft::SelectLinearModules(*model, lora));
  int64_t frozen = 0;
  std::set<const c10::TensorImpl*> counted;  // a tied head's weight is the embedding's
  for (const at::Tensor& p : model->parameters()) {
    if (counted.insert(p.unsafeGetTensorImpl()).second) frozen += p.numel();
  }
  int64_t trainable = 0;
  std::vector<std::pair<std::string, int64_t>> folded;  // the names with ".<index>." as ".N."
  static const std::regex kIndex(R"(\.[0-9]+\.)");
  for (const peft::LinearModule& m : adapted) {
    trainable += peft::AdapterParameters(m, lora.dim);
    const std::string name = std::regex_replace(m.name, kIndex, ".N.");
    auto it = std::find_if(folded.begin(), folded.end(),
                           [&](const auto& entry) { return entry.first == name; });
    if (it == folded.end()) {
      folded.emplace_back(name, 1);
    } else {
      ++it->second;
    }
  }
  out << "peft: LoRA of rank " << lora.dim << ", alpha " << lora.alpha << " (scale "
      << lora.alpha / static_cast<double>(lora.dim) << "), dropout " << lora.dropout << " ("
      << peft::AbslUnparseFlag(lora.dropout_position) << "), A "
      << peft::AbslUnparseFlag(lora.lora_A_init) << ", on " << adapted.size()
      << " linear layers (N: a layer's index):\n";
  for (const auto& [name, count] : folded) out << "  " << name << " x" << count << "\n";
  // An adapter parameter's weight (float32; bf16 with its float32 main copy), gradient and
  // AdamW's two moments, on the whole model.
  const int64_t state_bytes = (options.bf16 ? 2 + 4 + 4 : 4 + 4) + 8;
  out << "peft: trainable " << trainable << " adapter parameters (" << Mib(state_bytes * trainable)
      << " with their gradients and AdamW state, over all ranks); frozen " << frozen
      << " model parameters (" << Mib((options.bf16 ? 2 : 4) * frozen) << ")\n";
  return absl::OkStatus();
}

}  // namespace

std::string CompressSteps(const std::vector<int64_t>& steps) {
  if (steps.empty()) return "none";
  std::vector<std::string> parts;
  for (size_t i = 0; i < steps.size();) {
    size_t end = i + 1;
    if (i + 2 < steps.size()) {
      const int64_t stride = steps[i + 1] - steps[i];
      while (end < steps.size() && steps[end] - steps[end - 1] == stride) ++end;
      if (end - i >= 3) {
        parts.push_back(absl::StrCat(steps[i], "-", steps[end - 1],
                                     stride == 1 ? "" : absl::StrCat(" every ", stride)));
        i = end;
        continue;
      }
      end = i + 1;
    }
    parts.push_back(absl::StrCat(steps[i]));
    i = end;
  }
  return absl::StrJoin(parts, ", ");
}

absl::Status DryRun(const TrainOptions& options, int world_size, std::ostream& out) {
  const auto start = std::chrono::steady_clock::now();
  out << "dry run: nothing is trained, loaded or checkpointed\n";
  KEEL_ASSIGN_OR_RETURN(const parallel::MeshLayout layout, CheckGeometry(options, world_size));
  PrintLayout(layout, out);
  out << "model: " << models::DescribeModel(options.model)
      << (options.pretrained_path.empty() ? "" : " (from " + options.pretrained_path + ")") << "\n";
  PrintPrecisionAndMemory(options, layout, out);
  KEEL_RETURN_IF_ERROR(PrintPeft(options, out));
  // The schedule and the data are the data-parallel ranks' (model-parallel ranks share them).
  const int dp = layout.data_parallel_size();
  KEEL_ASSIGN_OR_RETURN(ScratchDirectory scratch, ScratchDirectory::Create());
  KEEL_ASSIGN_OR_RETURN(TrainData data, OpenData(options, dp, scratch.path(), out));
  KEEL_ASSIGN_OR_RETURN(ScheduleWalk walk, WalkSchedule(options, dp, data));
  const optim::ParamSchedulerOptions schedule =
      LrSchedule(options.lr_scheduler, options.derived_lr_steps, walk.total_steps);
  KEEL_ASSIGN_OR_RETURN(LrWd values, WalkLrWd(schedule, walk.steps));
  PrintSchedule(options, dp, data, walk, out);
  out << "learning rate and weight decay:\n";
  PrintLrWd(walk, values, schedule.lr_warmup_steps, out);
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(options.run_dir));
  const std::string plot = base::JoinPath(options.run_dir, "schedule.svg");
  KEEL_RETURN_IF_ERROR(WriteSchedulePlot(plot, walk, values));
  out << "plot: " << plot << "\n";
  PrintWarnings(options, walk, data.splits, out);
  for (const std::string& warning : LrScheduleWarnings(schedule, walk.total_steps)) {
    out << "warning: " << warning << "\n";
  }
  out << "dry run took "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
