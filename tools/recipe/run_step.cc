#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "gradients/norm_check.h"
#include "tools/recipe/internal/run_state.h"
#include "tools/recipe/run.h"
#include "tools/recipe/stages.h"

namespace keel::tools::recipe {
namespace {

// Labels of `batch` that count.
int64_t LabelTokens(const TokenBatch& batch) {
  if (!batch.loss_mask.defined()) return batch.labels.numel();
  return static_cast<int64_t>(batch.loss_mask.sum().item<double>());
}

}  // namespace

absl::StatusOr<StepOutput> Run::Step(const std::vector<std::vector<int64_t>>& micro_batches) {
  State& s = *state_;
  s.Enter(Phase::kBatches);
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
  const double label_tokens = static_cast<double>(std::max<int64_t>(output.label_tokens, 1));
  output.lr = s.lr_scheduler->GetLr();
  s.optimizer->PrepareForGradAccumulation();
  const StepScaling scaling =
      ScaleStep(output.label_tokens, static_cast<int64_t>(micro_batches.size()), runtime_);
  StageRunOptions stages;
  stages.loss_scale = scaling.loss_scale;
  stages.activation_dtype = options_.bf16 ? at::kBFloat16 : at::kFloat;
  s.model->moe_stats().aux_loss_scale = scaling.aux_loss_scale;
  stages.before_last_backward = [&s] { s.optimizer->PrepareForFinalBackward(); };
  stages.without_backward = [&s] { s.optimizer->SkipBackward(); };
  s.Enter(Phase::kForwardBackward);
  KEEL_ASSIGN_OR_RETURN(const at::Tensor device_loss_sum,
                        RunStages(*s.model, batches, runtime_, stages));
  s.Enter(Phase::kGradientSync);
  KEEL_RETURN_IF_ERROR(State::Timed(s.gradient_wait, [&] { return s.optimizer->Wait(); }));
  s.Enter(Phase::kStepEnd);
  KEEL_RETURN_IF_ERROR(
      ReduceSequenceParallelGrads(*s.model, s.optimizer->StepParameters(), runtime_));
  KEEL_RETURN_IF_ERROR(ReduceEmbeddingGrads(*s.model, s.optimizer->StepParameters(), runtime_));
  KEEL_ASSIGN_OR_RETURN(const at::Tensor grad_norm,
                        s.optimizer->ClipGradNorm(options_.max_norm, scaling.gradients));
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
  auto [aux, tokens] = state_->model->moe_stats().Take(options_.model.num_moe_experts);
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
      gradients::CheckGradNorm(state_->optimizer->StepParameters(), runtime_.control_group()));
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
  // No dropout (a LoRA adapter's) in validation, nor its draws from the training's generator.
  struct EvalMode {
    explicit EvalMode(torch::nn::Module& model) : model(model) { model.eval(); }
    ~EvalMode() { model.train(); }
    torch::nn::Module& model;
  } eval_mode(*s.model);
  const Splits& splits = s.data.splits;
  const int64_t batch_size = options_.local_batch_size;
  // Every rank runs the same number of rounds (a batch each, or none at the end), so that all
  // poll for preemption together after each.
  const int64_t per_round = runtime_.dp_size * batch_size;
  const int64_t rounds = (splits.val_size() + per_round - 1) / per_round;
  at::Tensor loss_sum;  // on the device, read once at the end
  int64_t tokens = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    s.Enter(Phase::kValidation);
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

}  // namespace keel::tools::recipe
