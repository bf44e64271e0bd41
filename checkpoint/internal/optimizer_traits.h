// Per optimizer kind (optim::OptimizerKind), what OptimizerState saves and loads: the
// param-group options by their PyTorch names and the per-parameter state tensors, as PyTorch's
// state_dict holds them.
#ifndef KEEL_CHECKPOINT_INTERNAL_OPTIMIZER_TRAITS_H_
#define KEEL_CHECKPOINT_INTERNAL_OPTIMIZER_TRAITS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ATen/ops/zeros_like.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/fields.h"
#include "base/json.h"
#include "base/status.h"
#include "checkpoint/state_dict.h"
#include "optim/optimizer_kind.h"
#include "parallel/layout.h"
#include "torch/optim/adagrad.h"
#include "torch/optim/adam.h"
#include "torch/optim/adamw.h"
#include "torch/optim/rmsprop.h"
#include "torch/optim/sgd.h"

namespace keel::checkpoint::internal {

using ::keel::base::Json;

// Param-group options of Adam and AdamW, by their PyTorch names.
struct AdamGroupOptions {
  double lr = 0.0;
  std::vector<double> betas;
  double eps = 0.0;
  double weight_decay = 0.0;
  bool amsgrad = false;
};

template <typename O, typename V, base::IsFieldsOf<O, AdamGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("betas", o.betas);
  v("eps", o.eps);
  v("weight_decay", o.weight_decay);
  v("amsgrad", o.amsgrad);
}

// Param-group options of SGD, by their PyTorch names.
struct SgdGroupOptions {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

template <typename O, typename V, base::IsFieldsOf<O, SgdGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("momentum", o.momentum);
  v("dampening", o.dampening);
  v("weight_decay", o.weight_decay);
  v("nesterov", o.nesterov);
}

// A new state tensor for `param` to read into; while checking, the parameter itself stands
// for it (same shape and dtype, never written).
inline at::Tensor StateLike(const at::Tensor& param, const StateReader& reader) {
  return reader.checking() ? param : at::zeros_like(param, at::MemoryFormat::Preserve);
}

// Reads the saved tensor `key` into `target`; clears `fits` unless the saved tensor exists
// with the target's dtype and global shape (the reader reports those differences).
inline absl::Status ReadInto(StateReader& reader, const std::string& key, const at::Tensor& target,
                             const std::optional<parallel::TensorLayout>& layout, bool& fits) {
  const SavedTensorInfo* info = reader.FindTensor(key);
  const std::vector<int64_t> global = layout ? layout->global_shape : target.sizes().vec();
  if (info == nullptr || info->dtype != target.scalar_type() || info->shape != global) {
    fits = false;
  }
  return reader.ReadTensor(key, TensorRef{target, layout});
}

// A saved "step" count: false (reported missing) when absent. Errors: kInvalidArgument for one
// that is not an integer >= 0.
inline absl::StatusOr<bool> ReadStep(const Json& entry, const std::string& prefix,
                                     StateReader& reader, int64_t& step) {
  if (!entry.is_object() || !entry.contains("step")) {
    reader.ReportMissing(prefix + "step");
    return false;
  }
  KEEL_RETURN_IF_ERROR(base::FromJson(entry["step"], prefix + "step", step));
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "step (", step, ") must be >= 0"));
  }
  return true;
}

// Adam and AdamW, whose options and per-parameter state have the same fields.
template <typename OptionsT, typename ParamStateT>
struct AdamTraits {
  using Options = OptionsT;
  using ParamState = ParamStateT;
  using Group = AdamGroupOptions;

  static Group ToGroup(const Options& o) {
    return Group{o.lr(),
                 {std::get<0>(o.betas()), std::get<1>(o.betas())},
                 o.eps(),
                 o.weight_decay(),
                 o.amsgrad()};
  }

  static absl::Status Check(const Group& g, const std::string& what) {
    if (g.betas.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".betas must hold 2 values, got ", g.betas.size()));
    }
    return absl::OkStatus();
  }

  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.betas(std::make_tuple(g.betas[0], g.betas[1]));
    o.eps(g.eps);
    o.weight_decay(g.weight_decay);
    o.amsgrad(g.amsgrad);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<parallel::TensorLayout>& layout, State& state, Json& entry) {
    entry["step"] = s.step();
    state.tensors[prefix + "exp_avg"] = TensorRef{s.exp_avg(), layout};
    state.tensors[prefix + "exp_avg_sq"] = TensorRef{s.exp_avg_sq(), layout};
    if (s.max_exp_avg_sq().defined()) {
      state.tensors[prefix + "max_exp_avg_sq"] = TensorRef{s.max_exp_avg_sq(), layout};
    }
  }

  // The saved state of `param`, or nullptr if part of it is missing or does not fit.
  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<parallel::TensorLayout>& layout, StateReader& reader) {
    int64_t step = 0;
    KEEL_ASSIGN_OR_RETURN(bool has_step, ReadStep(entry, prefix, reader, step));
    if (!has_step) return nullptr;
    auto s = std::make_unique<ParamState>();
    s->step(step);
    bool fits = true;
    s->exp_avg(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "exp_avg", s->exp_avg(), layout, fits));
    s->exp_avg_sq(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "exp_avg_sq", s->exp_avg_sq(), layout, fits));
    if (group.amsgrad || reader.FindTensor(prefix + "max_exp_avg_sq") != nullptr) {
      s->max_exp_avg_sq(StateLike(param, reader));
      KEEL_RETURN_IF_ERROR(
          ReadInto(reader, prefix + "max_exp_avg_sq", s->max_exp_avg_sq(), layout, fits));
    }
    if (!fits) return nullptr;
    return s;
  }
};

struct AdamKind : AdamTraits<torch::optim::AdamOptions, torch::optim::AdamParamState> {
  static constexpr optim::OptimizerKind kKind = optim::OptimizerKind::kAdam;
};
struct AdamWKind : AdamTraits<torch::optim::AdamWOptions, torch::optim::AdamWParamState> {
  static constexpr optim::OptimizerKind kKind = optim::OptimizerKind::kAdamW;
};

struct SgdKind {
  using Options = torch::optim::SGDOptions;
  using ParamState = torch::optim::SGDParamState;
  using Group = SgdGroupOptions;
  static constexpr optim::OptimizerKind kKind = optim::OptimizerKind::kSgd;

  static Group ToGroup(const Options& o) {
    return Group{o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()};
  }

  static absl::Status Check(const Group& g, const std::string& what) { return absl::OkStatus(); }

  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.momentum(g.momentum);
    o.dampening(g.dampening);
    o.weight_decay(g.weight_decay);
    o.nesterov(g.nesterov);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<parallel::TensorLayout>& layout, State& state, Json& entry) {
    if (s.momentum_buffer().defined()) {
      state.tensors[prefix + "momentum_buffer"] = TensorRef{s.momentum_buffer(), layout};
    }
  }

  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<parallel::TensorLayout>& layout, StateReader& reader) {
    auto s = std::make_unique<ParamState>();
    bool fits = true;
    s->momentum_buffer(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(
        ReadInto(reader, prefix + "momentum_buffer", s->momentum_buffer(), layout, fits));
    if (!fits) return nullptr;
    return s;
  }
};

// Param-group options of RMSprop, by their PyTorch names.
struct RmspropGroupOptions {
  double lr = 0.0;
  double alpha = 0.0;
  double eps = 0.0;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
};

template <typename O, typename V, base::IsFieldsOf<O, RmspropGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("alpha", o.alpha);
  v("eps", o.eps);
  v("weight_decay", o.weight_decay);
  v("momentum", o.momentum);
  v("centered", o.centered);
}

// Param-group options of Adagrad, by their PyTorch names.
struct AdagradGroupOptions {
  double lr = 0.0;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 0.0;
};

template <typename O, typename V, base::IsFieldsOf<O, AdagradGroupOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("lr", o.lr);
  v("lr_decay", o.lr_decay);
  v("weight_decay", o.weight_decay);
  v("initial_accumulator_value", o.initial_accumulator_value);
  v("eps", o.eps);
}

struct RmspropKind {
  using Options = torch::optim::RMSpropOptions;
  using ParamState = torch::optim::RMSpropParamState;
  using Group = RmspropGroupOptions;
  static constexpr optim::OptimizerKind kKind = optim::OptimizerKind::kRmsprop;

  static Group ToGroup(const Options& o) {
    return Group{o.lr(), o.alpha(), o.eps(), o.weight_decay(), o.momentum(), o.centered()};
  }
  static absl::Status Check(const Group& g, const std::string& what) { return absl::OkStatus(); }
  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.alpha(g.alpha);
    o.eps(g.eps);
    o.weight_decay(g.weight_decay);
    o.momentum(g.momentum);
    o.centered(g.centered);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<parallel::TensorLayout>& layout, State& state, Json& entry) {
    entry["step"] = s.step();
    state.tensors[prefix + "square_avg"] = TensorRef{s.square_avg(), layout};
    if (s.momentum_buffer().defined()) {
      state.tensors[prefix + "momentum_buffer"] = TensorRef{s.momentum_buffer(), layout};
    }
    if (s.grad_avg().defined()) {
      state.tensors[prefix + "grad_avg"] = TensorRef{s.grad_avg(), layout};
    }
  }

  // momentum_buffer exists with momentum > 0 and grad_avg when centered, as in PyTorch.
  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<parallel::TensorLayout>& layout, StateReader& reader) {
    int64_t step = 0;
    KEEL_ASSIGN_OR_RETURN(bool has_step, ReadStep(entry, prefix, reader, step));
    if (!has_step) return nullptr;
    auto s = std::make_unique<ParamState>();
    s->step(step);
    bool fits = true;
    s->square_avg(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "square_avg", s->square_avg(), layout, fits));
    if (group.momentum > 0 || reader.FindTensor(prefix + "momentum_buffer") != nullptr) {
      s->momentum_buffer(StateLike(param, reader));
      KEEL_RETURN_IF_ERROR(
          ReadInto(reader, prefix + "momentum_buffer", s->momentum_buffer(), layout, fits));
    }
    if (group.centered || reader.FindTensor(prefix + "grad_avg") != nullptr) {
      s->grad_avg(StateLike(param, reader));
      KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "grad_avg", s->grad_avg(), layout, fits));
    }
    if (!fits) return nullptr;
    return s;
  }
};

struct AdagradKind {
  using Options = torch::optim::AdagradOptions;
  using ParamState = torch::optim::AdagradParamState;
  using Group = AdagradGroupOptions;
  static constexpr optim::OptimizerKind kKind = optim::OptimizerKind::kAdagrad;

  static Group ToGroup(const Options& o) {
    return Group{o.lr(), o.lr_decay(), o.weight_decay(), o.initial_accumulator_value(), o.eps()};
  }
  static absl::Status Check(const Group& g, const std::string& what) { return absl::OkStatus(); }
  static void Apply(const Group& g, Options& o) {
    o.lr(g.lr);
    o.lr_decay(g.lr_decay);
    o.weight_decay(g.weight_decay);
    o.initial_accumulator_value(g.initial_accumulator_value);
    o.eps(g.eps);
  }

  static void Save(const ParamState& s, const std::string& prefix,
                   const std::optional<parallel::TensorLayout>& layout, State& state, Json& entry) {
    entry["step"] = s.step();
    state.tensors[prefix + "sum"] = TensorRef{s.sum(), layout};
  }

  static absl::StatusOr<std::unique_ptr<ParamState>> Load(
      const at::Tensor& param, const Group& group, const Json& entry, const std::string& prefix,
      const std::optional<parallel::TensorLayout>& layout, StateReader& reader) {
    int64_t step = 0;
    KEEL_ASSIGN_OR_RETURN(bool has_step, ReadStep(entry, prefix, reader, step));
    if (!has_step) return nullptr;
    auto s = std::make_unique<ParamState>();
    s->step(step);
    bool fits = true;
    s->sum(StateLike(param, reader));
    KEEL_RETURN_IF_ERROR(ReadInto(reader, prefix + "sum", s->sum(), layout, fits));
    if (!fits) return nullptr;
    return s;
  }
};

// Calls fn(K{}) with the traits of `kind`.
template <typename Fn>
auto WithTraits(optim::OptimizerKind kind, Fn&& fn) {
  switch (kind) {
    case optim::OptimizerKind::kAdam:
      return fn(AdamKind{});
    case optim::OptimizerKind::kAdamW:
      return fn(AdamWKind{});
    case optim::OptimizerKind::kSgd:
      return fn(SgdKind{});
    case optim::OptimizerKind::kRmsprop:
      return fn(RmspropKind{});
    case optim::OptimizerKind::kAdagrad:
      break;
  }
  return fn(AdagradKind{});
}

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_OPTIMIZER_TRAITS_H_
