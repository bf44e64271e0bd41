#include "parallel/pipeline_parallel/schedules.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "parallel/comm_timers.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::parallel {
namespace {

// Activations go to the next stage, gradients to the previous one: between two stages each
// direction carries one kind, in order; the tags only make that explicit.
constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;

// What one exchange with the neighbouring stages sends and receives; undefined tensors and
// empty shapes are nothing to do.
struct Exchange {
  at::Tensor send_next;            // an activation
  at::Tensor send_prev;            // an input's gradient
  std::vector<int64_t> recv_prev;  // the shape of an activation to receive, if any
  std::vector<int64_t> recv_next;  // the shape of an output's gradient to receive, if any
};

struct Received {
  at::Tensor prev;
  at::Tensor next;
};

// This rank's place in the pipeline group and its point-to-point traffic.
class StageLink {
 public:
  explicit StageLink(c10d::ProcessGroup* group)
      : group_(group), rank_(base::GroupRank(group)), size_(base::GroupSize(group)) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool first() const { return rank_ == 0; }
  bool last() const { return rank_ == size_ - 1; }

  // Megatron's _p2p_ops: even stages post their sends first, odd stages their receives, so
  // that two neighbours post matching operations in the same order (NCCL's point-to-point
  // completes only once the peer has posted the match); every operation is waited for, and
  // the wait counted as CommKind::kPipeline. Operations towards a stage that does not exist are
  // dropped.
  Received Run(const Exchange& e, const at::TensorOptions& options) {
    Received got;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<std::vector<at::Tensor>> buffers;
    const auto send = [&](const at::Tensor& tensor, int peer, int tag) {
      if (!tensor.defined() || peer < 0 || peer >= size_) return;
      buffers.push_back({tensor.detach().contiguous()});
      works.push_back(group_->send(buffers.back(), peer, tag));
    };
    const auto recv = [&](at::Tensor& out, const std::vector<int64_t>& shape, int peer, int tag) {
      if (shape.empty() || peer < 0 || peer >= size_) return;
      out = at::empty(shape, options);
      buffers.push_back({out});
      works.push_back(group_->recv(buffers.back(), peer, tag));
    };
    if (rank_ % 2 == 0) {
      send(e.send_next, rank_ + 1, kActivationTag);
      recv(got.prev, e.recv_prev, rank_ - 1, kActivationTag);
      send(e.send_prev, rank_ - 1, kGradientTag);
      recv(got.next, e.recv_next, rank_ + 1, kGradientTag);
    } else {
      recv(got.prev, e.recv_prev, rank_ - 1, kActivationTag);
      send(e.send_next, rank_ + 1, kActivationTag);
      recv(got.next, e.recv_next, rank_ + 1, kGradientTag);
      send(e.send_prev, rank_ - 1, kGradientTag);
    }
    if (works.empty()) return got;
    CommTimers::Time(CommKind::kPipeline, [&] {
      for (const auto& work : works) work->wait();
    });
    return got;
  }

 private:
  c10d::ProcessGroup* group_;
  int rank_;
  int size_;
};

// A micro-batch between its forward and its backward.
struct InFlight {
  at::Tensor input;
  at::Tensor output;
};

// One RunPipeline call: the stage's forward and backward passes in OneFOneBSchedule's order,
// and between them the exchanges of Megatron's schedule: after a forward that a backward
// follows, its activation goes out and that backward's output gradient comes in in one
// exchange (send_forward_recv_backward), after a backward that a forward follows likewise
// (send_backward_recv_forward); between two passes of one kind, the send and then the receive.
class StagePass {
 public:
  StagePass(const StageCallbacks& stage, c10d::ProcessGroup* group, const PipelineOptions& options)
      : callbacks_(stage), options_(options), link_(group) {}

  int stage() const { return link_.rank(); }
  int num_stages() const { return link_.size(); }

  // Runs `action` after the previous one (nullptr for the first), receiving what it needs and
  // sending on what the previous one produced.
  absl::Status Step(const PipelineAction& action, const PipelineAction* previous) {
    const bool forward = action.kind == PipelineAction::Kind::kForward;
    const int64_t i = action.micro_batch;
    const std::string what = Describe(i, forward ? "forward" : "backward");
    Exchange exchange;
    std::vector<int64_t>& receive = forward ? exchange.recv_prev : exchange.recv_next;
    receive = callbacks_.activation_shape(i);
    if (previous != nullptr && previous->kind == action.kind) {
      KEEL_RETURN_IF_ERROR(Communicate(TakePending(), what).status());  // send, then receive
    } else if (previous != nullptr) {
      const Exchange pending = TakePending();
      exchange.send_next = pending.send_next;
      exchange.send_prev = pending.send_prev;
    }
    KEEL_ASSIGN_OR_RETURN(Received received, Communicate(exchange, what));
    return forward ? Forward(i, received.prev, what) : Backward(i, received.next, what);
  }

  // Sends what the last pass produced.
  absl::Status Finish() { return Communicate(TakePending(), "finishing").status(); }

 private:
  absl::StatusOr<Received> Communicate(const Exchange& exchange, const std::string& what) {
    Received received;
    KEEL_RETURN_IF_ERROR(
        base::CallTorch(absl::StatusCode::kUnavailable,
                        absl::StrCat(what, ": exchanging with the neighbouring stages"),
                        [&] { received = link_.Run(exchange, options_.activation_options); }));
    return received;
  }

  Exchange TakePending() { return std::exchange(pending_, Exchange()); }

  // Runs the stage on micro-batch i's input (undefined on the first stage) and keeps the input
  // and output for the backward pass; the output goes to the next stage with the next exchange.
  absl::Status Forward(int64_t i, at::Tensor input, const std::string& what) {
    InFlight step{std::move(input), at::Tensor()};
    if (step.input.defined()) step.input.requires_grad_(!options_.forward_only);
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, what, [&] {
      at::AutoGradMode grad_mode(!options_.forward_only);
      step.output = callbacks_.forward(i, step.input);
    }));
    if (!link_.last()) {
      KEEL_RETURN_IF_ERROR(CheckActivation(i, step.output, what));
      pending_.send_next = step.output;
    }
    if (!options_.forward_only) in_flight_.emplace(i, std::move(step));
    return absl::OkStatus();
  }

  // Backpropagates micro-batch i from its output's gradient (undefined on the last stage,
  // which starts from its loss); the input's gradient goes back with the next exchange. An
  // input the loss does not depend on has no gradient: zeros go back, its true gradient, so
  // that the previous stage's receive is matched.
  absl::Status Backward(int64_t i, const at::Tensor& output_grad, const std::string& what) {
    InFlight step = std::move(in_flight_.at(i));
    in_flight_.erase(i);
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, what, [&] {
      if (callbacks_.before_backward) callbacks_.before_backward(i);
      if (output_grad.defined()) {
        torch::autograd::backward({step.output}, {output_grad});
      } else {
        step.output.backward();  // the last stage's loss
      }
    }));
    if (link_.first()) return absl::OkStatus();
    at::Tensor input_grad = step.input.grad();
    pending_.send_prev = input_grad.defined() ? input_grad : at::zeros_like(step.input);
    return absl::OkStatus();
  }

  // The next stage receives into a buffer of the activation's declared dtype and shape, which
  // a point-to-point transfer does not check (NCCL hangs or reads garbage): an activation of
  // another is an error naming both, before anything is sent.
  absl::Status CheckActivation(int64_t i, const at::Tensor& activation,
                               const std::string& what) const {
    const std::vector<int64_t> shape = callbacks_.activation_shape(i);
    const at::ScalarType dtype = options_.activation_options.dtype().toScalarType();
    if (activation.defined() && activation.scalar_type() == dtype &&
        activation.sizes().vec() == shape) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        what, " produced ",
        activation.defined() ? absl::StrCat(c10::toString(activation.scalar_type()), " [",
                                            absl::StrJoin(activation.sizes(), ", "), "]")
                             : "no activation",
        ", but stage ", stage() + 1, " receives ", c10::toString(dtype), " [",
        absl::StrJoin(shape, ", "),
        "] (PipelineOptions::activation_options and StageCallbacks::activation_shape)"));
  }

  std::string Describe(int64_t i, absl::string_view pass) const {
    return absl::StrCat("pipeline stage ", stage(), " of ", num_stages(), ", micro-batch ", i + 1,
                        "'s ", pass);
  }

  const StageCallbacks& callbacks_;
  const PipelineOptions& options_;
  StageLink link_;
  std::map<int64_t, InFlight> in_flight_;
  // What the last pass produced for a neighbour, sent with the next exchange.
  Exchange pending_;
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
  KEEL_RETURN_IF_ERROR(base::CheckGroupCarries(pp_group, options.activation_options.device(),
                                               "the pipeline's activations and gradients"));
  StagePass pass(stage, pp_group, options);
  const std::vector<PipelineAction> actions =
      OneFOneBSchedule(num_micro_batches, pass.stage(), pass.num_stages(), options.forward_only);
  for (size_t k = 0; k < actions.size(); ++k) {
    KEEL_RETURN_IF_ERROR(pass.Step(actions[k], k == 0 ? nullptr : &actions[k - 1]));
  }
  return pass.Finish();
}

}  // namespace keel::parallel
