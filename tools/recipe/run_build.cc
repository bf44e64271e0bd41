#include <string>
#include <utility>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/CPUGeneratorImpl.h"
#include "base/files.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "gradients/parameters.h"
#include "models/registry.h"
#include "parallel/moe/token_dispatcher.h"
#include "tools/recipe/internal/run_state.h"
#include "tools/recipe/lora.h"
#include "tools/recipe/optimizer.h"
#include "tools/recipe/run.h"
#include "tools/recipe/stages.h"
#include "torch/utils.h"

namespace keel::tools::recipe {

// The model (initialised on the CPU from the default generator, seeded here, so every device
// and every tensor-parallel size starts from the same weights), with LoRA its frozen base from
// model.pretrained_path and the adapters, AdamW with the data-parallel sync over the trainable
// parameters' layouts, and the LR schedule.
absl::Status Run::BuildModel() {
  State& s = *state_;
  if (options_.tf32) base::SetCudaMatmulTf32(true);
  torch::manual_seed(options_.seed);
  KEEL_RETURN_IF_ERROR(base::CallTorch(
      absl::StatusCode::kResourceExhausted, "building the model on this rank's device", [&] {
        s.model =
            models::BuildLanguageModel(options_.model, runtime_.model_groups(options_.distributed));
        s.model->to(runtime_.device);
        if (options_.bf16) s.model->to(at::kBFloat16);
      }));
  if (options_.peft.has_value()) {
    // A LoRA checkpoint holds the adapters only: the base comes from model.pretrained_path at
    // every start, before the adapters (drawn on the model's device, in its dtype) hide it.
    KEEL_RETURN_IF_ERROR(LoadPretrained());
    if (options_.pretrained_path.empty() && runtime_.rank == 0) {
      *runtime_.log << "warning: peft without model.pretrained_path: the frozen base is the "
                       "seed's random initialisation\n";
    }
    absl::Status attached;
    KEEL_RETURN_IF_ERROR(
        base::CallTorch(absl::StatusCode::kResourceExhausted, "attaching the LoRA adapters", [&] {
          attached = AttachAdapters(*s.model, options_.model, *options_.peft, options_.seed);
        }));
    KEEL_RETURN_IF_ERROR(attached);
  }
  std::vector<gradients::NamedParameter> parameters =
      gradients::TrainableParameters({s.model.get()}, s.model->Layouts());
  MarkSharedEmbedding(*s.model, parameters);
  KEEL_ASSIGN_OR_RETURN(
      s.optimizer, BuildOptimizer(std::move(parameters), options_, runtime_, parallel::kExpertDim));
  absl::StatusOr<optim::ParamScheduler> lr_scheduler =
      optim::ParamScheduler::Create(s.lr_schedule, s.optimizer->optimizer());
  KEEL_RETURN_IF_ERROR(base::Annotate(lr_scheduler.status(), "lr_scheduler"));
  s.lr_scheduler.emplace(*std::move(lr_scheduler));
  return absl::OkStatus();
}

// Everything a checkpoint holds, and the checkpointer.
absl::Status Run::BuildCheckpointing() {
  State& s = *state_;
  checkpoint::ModelStateOptions model_state_options;
  model_state_options.model_save_format = options_.checkpoint.model_save_format;
  model_state_options.is_peft = options_.peft.has_value();
  model_state_options.layouts = s.model->Layouts();
  // With bf16 parameters the checkpoint holds their float32 main copies (each rank's shards of
  // them with the distributed optimizer): the truth, which a float32 run loads too.
  if (s.optimizer->has_main_copies()) {
    for (const gradients::NamedParameter& p : s.optimizer->StepParameters()) {
      model_state_options.stand_ins[p.name] = checkpoint::TensorRef{p.param, p.layout};
    }
  }
  s.model_state = std::make_unique<checkpoint::ModelState>(*s.model, model_state_options);
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
                 {kModelState, s.model_state.get()},
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
                                            options_.checkpoint, runtime_.checkpoint_group()));
  return base::MakeDirectories(options_.checkpoint.checkpoint_dir);
}

}  // namespace keel::tools::recipe
