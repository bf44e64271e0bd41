#include "gradients/grad_utils_cases.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "gradients/clip_grad_norm.h"
#include "gradients/tail_padding.h"

namespace keel::gradients {
namespace {

using base::Json;

absl::StatusOr<at::ScalarType> ReadDtype(const Json& json, const std::string& what) {
  std::string name;
  KEEL_RETURN_IF_ERROR(base::FromJson(json, what, name));
  static const std::pair<const char*, at::ScalarType> kDtypes[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"bfloat16", at::kBFloat16},
      {"float16", at::kHalf},  {"int64", at::kLong},     {"int32", at::kInt},
      {"int16", at::kShort},   {"int8", at::kChar},      {"uint8", at::kByte},
      {"bool", at::kBool}};
  for (const auto& [spelling, dtype] : kDtypes) {
    if (name == spelling) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype \"", name, "\""));
}

// A tensor of `dtype` and `shape` from row-major values (numbers or "nan"/"inf"/"-inf").
absl::StatusOr<at::Tensor> ReadTensor(const Json& values, const Json& shape_json,
                                      at::ScalarType dtype, const std::string& what) {
  std::vector<double> flat;
  std::vector<const Json*> pending = {&values};
  while (!pending.empty()) {  // flattens nested rows in order
    const Json* v = pending.back();
    pending.pop_back();
    if (v->is_array()) {
      for (auto it = v->rbegin(); it != v->rend(); ++it) pending.push_back(&*it);
      continue;
    }
    double value = 0;
    KEEL_RETURN_IF_ERROR(base::FromJson(*v, what, value));
    flat.push_back(value);
  }
  std::vector<int64_t> shape;
  KEEL_RETURN_IF_ERROR(base::FromJson(shape_json, what + ".shape", shape));
  at::Tensor tensor = at::tensor(flat, at::kDouble);
  if (tensor.numel() != c10::multiply_integers(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", tensor.numel(), " values do not fill shape ", shape_json.dump()));
  }
  return tensor.reshape(shape).to(dtype);
}

absl::StatusOr<at::Tensor> ReadParameter(const Json& spec, const std::string& what) {
  KEEL_ASSIGN_OR_RETURN(at::ScalarType dtype,
                        ReadDtype(spec.value("dtype", Json()), what + ".dtype"));
  std::vector<int64_t> shape;
  KEEL_RETURN_IF_ERROR(base::FromJson(spec.value("shape", Json()), what + ".shape", shape));
  bool requires_grad = true;
  KEEL_RETURN_IF_ERROR(base::FromJson(spec.value("requires_grad", Json(true)),
                                      what + ".requires_grad", requires_grad));
  at::Tensor param =
      at::zeros(shape, at::TensorOptions().dtype(dtype)).requires_grad_(requires_grad);
  const Json grad = spec.value("grad", Json());
  if (!grad.is_null()) {
    KEEL_ASSIGN_OR_RETURN(at::Tensor g, ReadTensor(grad, spec["shape"], dtype, what + ".grad"));
    param.mutable_grad() = g;
  }
  return param;
}

absl::StatusOr<double> ReadNormType(const Json& json) {
  double norm_type = 2.0;
  if (!json.is_null()) KEEL_RETURN_IF_ERROR(base::FromJson(json, "inputs.norm_type", norm_type));
  return norm_type;
}

Json GradsToJson(const std::vector<at::Tensor>& params) {
  Json grads = Json::array();
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) {
      grads.push_back(nullptr);
      continue;
    }
    const at::Tensor flat = p.grad().to(at::kDouble).flatten().contiguous();
    Json values = Json::array();
    for (int64_t i = 0; i < flat.numel(); ++i)
      values.push_back(base::DoubleToJson(flat.data_ptr<double>()[i]));
    grads.push_back(std::move(values));
  }
  return grads;
}

absl::StatusOr<Json> RunClip(const Json& inputs, bool impl) {
  std::vector<at::Tensor> all;
  std::vector<NamedParameter> clipped;
  if (impl) {
    const Json params = inputs.value("parameters", Json::array());
    for (size_t i = 0; i < params.size(); ++i) {
      KEEL_ASSIGN_OR_RETURN(at::Tensor p,
                            ReadParameter(params[i], absl::StrCat("inputs.parameters[", i, "]")));
      all.push_back(p);
      clipped.push_back({absl::StrCat("param", i), p});  // _clip_grad_norm_impl takes them all
    }
  } else {
    const Json parts = inputs.value("model_parts", Json::array());
    for (size_t i = 0; i < parts.size(); ++i) {
      for (size_t j = 0; j < parts[i].size(); ++j) {
        KEEL_ASSIGN_OR_RETURN(
            at::Tensor p,
            ReadParameter(parts[i][j], absl::StrCat("inputs.model_parts[", i, "][", j, "]")));
        all.push_back(p);
        if (p.requires_grad()) clipped.push_back({absl::StrCat("part", i, ".param", j), p});
      }
    }
  }
  std::optional<double> max_norm;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value(impl ? "max_norm" : "max_grad_norm", Json()),
                                      "inputs.max_norm", max_norm));
  ClipGradNormOptions options;
  KEEL_ASSIGN_OR_RETURN(options.norm_type, ReadNormType(inputs.value("norm_type", Json())));
  KEEL_RETURN_IF_ERROR(
      base::FromJson(inputs.value("foreach", Json(true)), "inputs.foreach", options.foreach));
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("error_if_nonfinite", Json(false)),
                                      "inputs.error_if_nonfinite", options.error_if_nonfinite));
  KEEL_ASSIGN_OR_RETURN(at::Tensor total, ClipGradNorm(max_norm, clipped, options));
  return Json{{"total_norm", base::DoubleToJson(total.item<double>())},
              {"total_norm_kind", max_norm.has_value() ? "tensor_float64" : "python_float"},
              {"grads", GradsToJson(all)}};
}

absl::StatusOr<Json> RunCountTailPadding(const Json& inputs) {
  KEEL_ASSIGN_OR_RETURN(at::ScalarType dtype,
                        ReadDtype(inputs.value("dtype", Json()), "inputs.dtype"));
  KEEL_ASSIGN_OR_RETURN(at::Tensor labels,
                        ReadTensor(inputs.value("labels", Json()), inputs.value("shape", Json()),
                                   dtype, "inputs.labels"));
  int64_t ignore_label = -100;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("ignore_label", Json(-100)),
                                      "inputs.ignore_label", ignore_label));
  KEEL_ASSIGN_OR_RETURN(int64_t result, CountTailPadding(labels, ignore_label));
  return Json{{"result", result}};
}

}  // namespace

absl::StatusOr<Json> RunGradUtilsCase(const Json& inputs) {
  std::string function;
  KEEL_RETURN_IF_ERROR(
      base::FromJson(inputs.value("function", Json()), "inputs.function", function));
  if (function == "count_tail_padding") return RunCountTailPadding(inputs);
  if (function == "clip_grad_norm") return RunClip(inputs, /*impl=*/false);
  if (function == "_clip_grad_norm_impl") return RunClip(inputs, /*impl=*/true);
  return absl::InvalidArgumentError(
      absl::StrCat("inputs.function \"", function,
                   "\" is not one of count_tail_padding, clip_grad_norm, _clip_grad_norm_impl"));
}

}  // namespace keel::gradients
