#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/reader.h"
#include "models/registry.h"
#include "peft/peft_format.h"
#include "tools/recipe/internal/run_state.h"
#include "tools/recipe/lora.h"
#include "tools/recipe/run.h"
#include "tools/recipe/seeds.h"
#include "tools/recipe/stages.h"
#include "torch/utils.h"

namespace keel::tools::recipe {

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
    if (!options_.peft.has_value()) KEEL_RETURN_IF_ERROR(LoadPretrained());  // LoRA's: at Build
    KEEL_RETURN_IF_ERROR(LoadPeftAdapter());
    s.optimizer->CopyModelToMain();
    return std::nullopt;
  }
  // The main copies were loaded: the bf16 parameters are their rounded values.
  KEEL_RETURN_IF_ERROR(s.optimizer->CopyMainToModel());
  if (chief && !options_.pretrained_path.empty()) {
    log << (options_.peft.has_value()
                ? "model: the frozen base from model.pretrained_path, the LoRA adapters from the "
                  "run's own checkpoint\n"
                : absl::StrCat("model: resuming from the run's own checkpoint, not from "
                               "model.pretrained_path (",
                               options_.pretrained_path, ")\n"));
  }
  if (chief && !options_.peft_adapter_path.empty()) {
    log << "peft: the adapters from the run's own checkpoint, not from peft.adapter_path ("
        << options_.peft_adapter_path << ")\n";
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
  // Distinct, well-mixed seeds for every rank.
  torch::manual_seed(DerivedSeed(options_.seed, {runtime_.rank, s.scheduler->step()}));
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
  if (options_.peft.has_value() && !AdaptsVocabulary()) {
    // The padded vocabulary (another tensor-parallel size) is the frozen base's, which comes
    // from model.pretrained_path, not from the checkpoint.
    std::vector<std::string>& incompatible = compared.incompatible;
    incompatible.erase(std::remove_if(incompatible.begin(), incompatible.end(),
                                      [](const std::string& line) {
                                        return absl::StartsWith(line, "model.padded_vocab_size:");
                                      }),
                       incompatible.end());
  }
  if (!compared.incompatible.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " holds another model, which this run cannot load: ",
                     absl::StrJoin(compared.incompatible, "; "),
                     "; resume with that model's configuration, or train in another run_dir"));
  }
  changes = std::move(compared.changed);
  return absl::OkStatus();
}

bool Run::AdaptsVocabulary() const {
  for (const std::string& vocab : state_->model->VocabParameters()) {
    const std::string module = vocab.substr(0, vocab.rfind('.'));
    if (state_->model->named_modules().contains(module + ".adapter")) return true;
  }
  return false;
}

absl::Status Run::LoadPretrained() {
  if (options_.pretrained_path.empty()) return absl::OkStatus();
  checkpoint::ModelStateOptions layout;
  layout.model_save_format = options_.checkpoint.model_save_format;
  layout.layouts = state_->model->Layouts();
  KEEL_ASSIGN_OR_RETURN(const std::set<std::string> other_stages,
                        KeysOfOtherStages(*state_->model, layout, runtime_));
  std::map<std::string, int64_t> unpadded_rows;
  for (const std::string& name : state_->model->VocabParameters()) {
    unpadded_rows[name] = options_.model.vocab_size;
  }
  absl::StatusOr<checkpoint::HfImportResult> loaded = checkpoint::LoadHfSafetensors(
      options_.pretrained_path, *state_->model, layout, other_stages, unpadded_rows);
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

absl::Status Run::LoadPeftAdapter() {
  if (options_.peft_adapter_path.empty()) return absl::OkStatus();
  checkpoint::ModelStateOptions keys;
  keys.is_peft = true;
  KEEL_ASSIGN_OR_RETURN(const std::set<std::string> other_stages,
                        KeysOfOtherStages(*state_->model, keys, runtime_));
  absl::StatusOr<checkpoint::HfImportResult> loaded = peft::LoadPeftAdapter(
      options_.peft_adapter_path, *state_->model, *options_.peft, other_stages);
  KEEL_RETURN_IF_ERROR(AgreeOverRanks(base::Annotate(loaded.status(), "peft.adapter_path"),
                                      runtime_, "loading peft.adapter_path"));
  if (runtime_.rank == 0) {
    *runtime_.log << "peft: the adapters start from " << options_.peft_adapter_path << " ("
                  << loaded->num_tensors << " tensors"
                  << (other_stages.empty() ? "" : " into the first pipeline stage") << ")\n";
  }
  return absl::OkStatus();
}

absl::Status Run::ResetState() {
  State& s = *state_;
  KEEL_RETURN_IF_ERROR(s.scheduler->LoadStateDict(
      {options_.step_scheduler.start_step, options_.step_scheduler.start_epoch}));
  KEEL_RETURN_IF_ERROR(s.data.sampler->LoadState(s.initial_sampler_state));
  s.loaded_blend.reset();
  // The trainable weights a new run starts from (and the generator after them), copied into
  // the live tensors, which the optimizer and the checkpoint's objects hold. A LoRA run's frozen
  // base, which its checkpoints do not hold, stays as model.pretrained_path gave it.
  torch::manual_seed(options_.seed);
  const std::shared_ptr<models::LanguageModel> fresh =
      models::BuildLanguageModel(options_.model, runtime_.model_groups(options_.distributed));
  if (options_.peft.has_value()) {
    KEEL_RETURN_IF_ERROR(AttachAdapters(*fresh, options_.model, *options_.peft, options_.seed));
  }
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "resetting the model", [&] {
    at::NoGradGuard no_grad;
    auto live = s.model->named_parameters();
    for (const auto& item : fresh->named_parameters()) {
      if (live[item.key()].requires_grad()) live[item.key()].copy_(item.value());
    }
  }));
  s.optimizer->Reset();
  s.numerics->Reset();
  KEEL_ASSIGN_OR_RETURN(s.lr_scheduler,
                        optim::ParamScheduler::Create(s.lr_schedule, s.optimizer->optimizer()));
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
