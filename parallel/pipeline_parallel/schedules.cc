#include "parallel/pipeline_parallel/schedules.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

std::atomic<int64_t> wait_nanoseconds{0};

// Activations go to the next stage, gradients to the previous one: between two stages each
// direction carries one kind, in order; the tags only make that explicit.
constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;

// This rank's place in the pipeline group and its point-to-point traffic.
class StageLink {
 public:
  explicit StageLink(c10d::ProcessGroup* group)
      : group_(group),
        rank_(group == nullptr ? 0 : group->getRank()),
        size_(group == nullptr ? 1 : group->getSize()) {}

  bool first() const { return rank_ == 0; }
  bool last() const { return rank_ == size_ - 1; }

  // Queues `tensor` for `peer` (the previous or next stage); WaitForSends finishes it.
  void Send(const at::Tensor& tensor, int peer, int tag) {
    std::vector<at::Tensor> tensors = {tensor.detach().contiguous()};
    sends_.push_back(group_->send(tensors, peer, tag));
    kept_.push_back(std::move(tensors));
  }

  // Blocks until `peer` has sent a tensor of `shape`, counting the wait.
  at::Tensor Recv(const std::vector<int64_t>& shape, const at::TensorOptions& options, int peer,
                  int tag) {
    std::vector<at::Tensor> tensors = {at::empty(shape, options)};
    const auto start = std::chrono::steady_clock::now();
    group_->recv(tensors, peer, tag)->wait();
    wait_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
    return tensors[0];
  }

  void WaitForSends() {
    for (const auto& work : sends_) work->wait();
    sends_.clear();
    kept_.clear();
  }

  int previous() const { return rank_ - 1; }
  int next() const { return rank_ + 1; }

 private:
  c10d::ProcessGroup* group_;
  int rank_;
  int size_;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  std::vector<std::vector<at::Tensor>> kept_;
};

// A micro-batch between its forward and its backward.
struct InFlight {
  at::Tensor input;
  at::Tensor output;
};

// One RunPipeline call: the stage's forward and backward passes, with what they exchange.
class StagePass {
 public:
  StagePass(const StageCallbacks& stage, c10d::ProcessGroup* group, const PipelineOptions& options)
      : callbacks_(stage),
        options_(options),
        link_(group),
        stage_(group == nullptr ? 0 : group->getRank()),
        num_stages_(group == nullptr ? 1 : group->getSize()) {}

  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }

  // Receives micro-batch i's input (past the first stage), runs the stage, sends the output
  // on (before the last stage), and keeps both for the backward pass.
  absl::Status Forward(int64_t i) {
    const std::string what = Describe(i, "forward");
    InFlight step;
    if (!link_.first()) {
      KEEL_RETURN_IF_ERROR(
          base::CallTorch(absl::StatusCode::kUnavailable, absl::StrCat(what, ": receiving"), [&] {
            step.input = link_.Recv(callbacks_.activation_shape(i), options_.activation_options,
                                    link_.previous(), kActivationTag);
          }));
      step.input.requires_grad_(!options_.forward_only);
    }
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, what, [&] {
      at::AutoGradMode grad_mode(!options_.forward_only);
      step.output = callbacks_.forward(i, step.input);
    }));
    if (!link_.last()) {
      KEEL_RETURN_IF_ERROR(
          base::CallTorch(absl::StatusCode::kUnavailable, absl::StrCat(what, ": sending"),
                          [&] { link_.Send(step.output, link_.next(), kActivationTag); }));
    }
    if (!options_.forward_only) in_flight_.emplace(i, std::move(step));
    return absl::OkStatus();
  }

  // Receives the gradient of micro-batch i's output (before the last stage; the last starts
  // from its loss), backpropagates through the stage and sends the input's gradient back.
  absl::Status Backward(int64_t i) {
    const std::string what = Describe(i, "backward");
    InFlight step = std::move(in_flight_.at(i));
    in_flight_.erase(i);
    at::Tensor output_grad;
    if (!link_.last()) {
      KEEL_RETURN_IF_ERROR(
          base::CallTorch(absl::StatusCode::kUnavailable, absl::StrCat(what, ": receiving"), [&] {
            output_grad = link_.Recv(callbacks_.activation_shape(i), options_.activation_options,
                                     link_.next(), kGradientTag);
          }));
    }
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, what, [&] {
      if (callbacks_.before_backward) callbacks_.before_backward(i);
      if (output_grad.defined()) {
        torch::autograd::backward({step.output}, {output_grad});
      } else {
        step.output.backward();  // the last stage's loss
      }
    }));
    if (link_.first()) return absl::OkStatus();
    return base::CallTorch(absl::StatusCode::kUnavailable, absl::StrCat(what, ": sending"),
                           [&] { link_.Send(step.input.grad(), link_.previous(), kGradientTag); });
  }

  absl::Status Finish() {
    return base::CallTorch(absl::StatusCode::kUnavailable,
                           absl::StrCat("pipeline stage ", stage_, ": finishing its sends"),
                           [&] { link_.WaitForSends(); });
  }

 private:
  std::string Describe(int64_t i, absl::string_view pass) const {
    return absl::StrCat("pipeline stage ", stage_, " of ", num_stages_, ", micro-batch ", i + 1,
                        "'s ", pass);
  }

  const StageCallbacks& callbacks_;
  const PipelineOptions& options_;
  StageLink link_;
  int stage_;
  int num_stages_;
  std::map<int64_t, InFlight> in_flight_;
};

}  // namespace

absl::StatusOr<StageLayers> LayersOfStage(int64_t num_layers, int num_stages, int stage) {
  if (num_stages < 1 || num_layers < num_stages || num_layers % num_stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers (", num_layers, ") must be a positive multiple of the pipeline stages (",
        num_stages, "): each stage holds the same number of layers, at least one"));
  }
  const int64_t per_stage = num_layers / num_stages;
  return StageLayers{stage * per_stage, per_stage};
}

std::vector<PipelineAction> OneFOneBSchedule(int64_t num_micro_batches, int stage, int num_stages,
                                             bool forward_only) {
  using Kind = PipelineAction::Kind;
  std::vector<PipelineAction> actions;
  if (forward_only) {
    for (int64_t i = 0; i < num_micro_batches; ++i) actions.push_back({Kind::kForward, i});
    return actions;
  }
  const int64_t warmup = std::min<int64_t>(num_stages - stage - 1, num_micro_batches);
  int64_t forwards = 0;
  int64_t backwards = 0;
  for (; forwards < warmup; ++forwards) actions.push_back({Kind::kForward, forwards});
  while (forwards < num_micro_batches) {
    actions.push_back({Kind::kForward, forwards++});
    actions.push_back({Kind::kBackward, backwards++});
  }
  while (backwards < num_micro_batches) actions.push_back({Kind::kBackward, backwards++});
  return actions;
}

absl::Status RunPipeline(int64_t num_micro_batches, const StageCallbacks& stage,
                         c10d::ProcessGroup* pp_group, const PipelineOptions& options) {
  StagePass pass(stage, pp_group, options);
  for (const PipelineAction& action :
       OneFOneBSchedule(num_micro_batches, pass.stage(), pass.num_stages(), options.forward_only)) {
    KEEL_RETURN_IF_ERROR(action.kind == PipelineAction::Kind::kForward
                             ? pass.Forward(action.micro_batch)
                             : pass.Backward(action.micro_batch));
  }
  return pass.Finish();
}

double PipelineWaitSeconds() { return 1e-9 * static_cast<double>(wait_nanoseconds.load()); }

}  // namespace keel::parallel
