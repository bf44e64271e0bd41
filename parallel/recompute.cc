#include "parallel/recompute.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/enum.h"
#include "torch/csrc/autograd/autograd.h"
#include "torch/csrc/autograd/function.h"

namespace keel::parallel {
namespace {

constexpr base::EnumSpelling<RecomputeGranularity> kGranularities[] = {
    {RecomputeGranularity::kFull, "full"}, {RecomputeGranularity::kSelective, "selective"}};
constexpr base::EnumSpelling<RecomputeMethod> kMethods[] = {{RecomputeMethod::kUniform, "uniform"},
                                                            {RecomputeMethod::kBlock, "block"}};
constexpr const char* kModules[] = {kCoreAttn, kMlp, kLayernorm};

// The states of the default generators that a computation on `device` may draw from: the
// CPU's, and the GPU's.
class GeneratorStates {
 public:
  explicit GeneratorStates(const c10::Device& device) : device_(device) {
    Add(at::detail::getDefaultCPUGenerator());
    if (device.is_cuda()) Add(at::globalContext().defaultGenerator(device));
  }
  const c10::Device& device() const { return device_; }
  void Restore() const {
    for (const auto& [generator, state] : states_) {
      at::Generator g = generator;
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(state);
    }
  }

 private:
  void Add(at::Generator generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    states_.emplace_back(generator, generator.get_state());
  }
  c10::Device device_;
  std::vector<std::pair<at::Generator, at::Tensor>> states_;
};

// The backward of Recompute: runs f again on the kept inputs with the forward's generator
// states and backpropagates the output's gradient through it, which accumulates the
// parameters' gradients (through their own AccumulateGrad nodes and hooks, once, as without
// recomputation) and gives the inputs'. Its next edges are the inputs' and a placeholder's that
// needs a gradient, so that the engine runs it even when no input needs one.
class RecomputeBackward : public torch::autograd::Node {
 public:
  RecomputeBackward(RecomputedFunction f, std::vector<at::Tensor> inputs, GeneratorStates states)
      : f_(std::move(f)), states_(std::move(states)) {
    for (const at::Tensor& input : inputs) {
      needs_grad_.push_back(input.requires_grad());
      inputs_.push_back(input.detach());
    }
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_INTERNAL_ASSERT(!inputs_.empty(), "Recompute: backward ran twice");
    const GeneratorStates now(states_.device());
    states_.Restore();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      inputs.push_back(inputs_[i].detach().requires_grad_(needs_grad_[i]));
    }
    at::Tensor output;
    {
      at::AutoGradMode grad_mode(true);
      output = f_(inputs);
    }
    now.Restore();
    inputs_.clear();
    torch::autograd::backward({output}, {grads[0]});
    torch::autograd::variable_list input_grads;
    for (size_t i = 0; i < inputs.size(); ++i) {
      input_grads.push_back(needs_grad_[i] ? inputs[i].grad() : at::Tensor());
    }
    input_grads.emplace_back();  // the placeholder's
    return input_grads;
  }

  std::string name() const override { return "keel::parallel::RecomputeBackward"; }
  void release_variables() override { inputs_.clear(); }

 private:
  RecomputedFunction f_;
  std::vector<at::Tensor> inputs_;
  std::vector<bool> needs_grad_;
  GeneratorStates states_;
};

}  // namespace

bool AbslParseFlag(absl::string_view text, RecomputeGranularity* out, std::string* error) {
  return base::ParseEnum(kGranularities, text, out, error);
}
std::string AbslUnparseFlag(RecomputeGranularity granularity) {
  return std::string(base::EnumName(kGranularities, granularity));
}
bool AbslParseFlag(absl::string_view text, RecomputeMethod* out, std::string* error) {
  return base::ParseEnum(kMethods, text, out, error);
}
std::string AbslUnparseFlag(RecomputeMethod method) {
  return std::string(base::EnumName(kMethods, method));
}

absl::Status CheckRecomputeOptions(const RecomputeOptions& options, int64_t layers_per_stage) {
  if (!options.recompute_granularity.has_value()) return absl::OkStatus();
  if (*options.recompute_granularity == RecomputeGranularity::kFull) {
    if (!options.recompute_method.has_value()) {
      return absl::InvalidArgumentError(
          "model.recompute_granularity \"full\" needs model.recompute_method: \"uniform\" or "
          "\"block\"");
    }
    const std::optional<int64_t> n = options.recompute_num_layers;
    if (!n.has_value() || *n < 1 || *n > layers_per_stage) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.recompute_num_layers (", n.has_value() ? absl::StrCat(*n) : "unset",
                       ") must be between 1 and the layers of a pipeline stage (", layers_per_stage,
                       ") with model.recompute_granularity \"full\""));
    }
    return absl::OkStatus();
  }
  if (options.recompute_method.has_value() || options.recompute_num_layers.has_value()) {
    return absl::InvalidArgumentError(
        "model.recompute_method and model.recompute_num_layers must be unset with "
        "model.recompute_granularity \"selective\" (it recomputes model.recompute_modules in "
        "every layer)");
  }
  for (const std::string& module : options.recompute_modules) {
    if (std::find(std::begin(kModules), std::end(kModules), module) == std::end(kModules)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.recompute_modules: \"", module, "\" is not a module Keel recomputes; allowed: ",
          absl::StrJoin(std::begin(kModules), std::end(kModules), ", ")));
    }
  }
  return absl::OkStatus();
}

bool RecomputesModule(const RecomputeOptions& options, absl::string_view module) {
  const std::vector<std::string>& modules = options.recompute_modules;
  return options.recompute_granularity == RecomputeGranularity::kSelective &&
         std::find(modules.begin(), modules.end(), module) != modules.end();
}

at::Tensor Recompute(const RecomputedFunction& f, const std::vector<at::Tensor>& inputs,
                     const std::vector<at::Tensor>& parameters) {
  auto needs_grad = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  const bool needed =
      at::GradMode::is_enabled() && (std::any_of(inputs.begin(), inputs.end(), needs_grad) ||
                                     std::any_of(parameters.begin(), parameters.end(), needs_grad));
  if (!needed) return f(inputs);
  GeneratorStates states(inputs.at(0).device());
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    output = f(inputs);
  }
  const at::Tensor placeholder =
      at::empty({0}, inputs[0].options().dtype(at::kFloat)).requires_grad_(true);
  auto node = std::shared_ptr<RecomputeBackward>(
      new RecomputeBackward(f, inputs, std::move(states)), torch::autograd::deleteNode);
  torch::autograd::edge_list edges;
  for (const at::Tensor& input : inputs)
    edges.push_back(torch::autograd::impl::gradient_edge(input));
  edges.push_back(torch::autograd::impl::gradient_edge(placeholder));
  node->set_next_edges(std::move(edges));
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

at::Tensor RecomputeIf(bool recompute, const RecomputedFunction& f,
                       const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& parameters) {
  return recompute ? Recompute(f, inputs, parameters) : f(inputs);
}

at::Tensor RunLayers(int64_t count, const RecomputeOptions& options, bool training,
                     const std::function<at::Tensor(int64_t, const at::Tensor&)>& layer,
                     const std::function<std::vector<at::Tensor>(int64_t)>& parameters_of,
                     const at::Tensor& input) {
  const bool full = training && options.recompute_granularity == RecomputeGranularity::kFull;
  const int64_t n = full ? *options.recompute_num_layers : 0;
  const bool uniform = full && options.recompute_method == RecomputeMethod::kUniform;
  at::Tensor x = input;
  for (int64_t first = 0; first < count;) {
    // The chunk from `first`: n layers recomputed (uniform, or the block's first n), else one.
    const bool recomputed = uniform || first < n;
    const int64_t end = uniform ? std::min(first + n, count) : first + 1;
    if (!recomputed) {
      x = layer(first, x);
    } else {
      std::vector<at::Tensor> parameters;
      for (int64_t i = first; i < end; ++i) {
        for (at::Tensor& p : parameters_of(i)) parameters.push_back(std::move(p));
      }
      x = Recompute(
          [layer, first, end](const std::vector<at::Tensor>& chunk_input) {
            at::Tensor y = chunk_input[0];
            for (int64_t i = first; i < end; ++i) y = layer(i, y);
            return y;
          },
          {x}, parameters);
    }
    first = end;
  }
  return x;
}

}  // namespace keel::parallel
