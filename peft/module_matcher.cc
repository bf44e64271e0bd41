#include "peft/module_matcher.h"

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "parallel/tensor_parallel/layers.h"

namespace keel::peft {
namespace {

// AutoModel's _compile_wildcard_pattern: every '*' stands for any characters, the rest is a
// regular expression.
std::string WildcardRegex(absl::string_view pattern) {
  std::string regex;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '*' && (i == 0 || pattern[i - 1] != '.')) regex += '.';
    regex += pattern[i];
  }
  return regex;
}

// The linear layers of `model`, in its order.
std::vector<LinearModule> LinearModules(const torch::nn::Module& model) {
  std::vector<LinearModule> linears;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const torch::nn::Module* module = item.value().get();
    if (dynamic_cast<const parallel::ColumnParallelLinearImpl*>(module) == nullptr &&
        dynamic_cast<const parallel::RowParallelLinearImpl*>(module) == nullptr) {
      continue;
    }
    const at::Tensor weight = module->named_parameters(/*recurse=*/false)["weight"];
    linears.push_back({item.key(), weight.size(1), weight.size(0)});
  }
  return linears;
}

// The names of up to 6 of `linears`, for an error message.
std::string SomeNames(const std::vector<LinearModule>& linears) {
  std::vector<std::string> names;
  for (size_t i = 0; i < linears.size() && i < 6; ++i) names.push_back(linears[i].name);
  return absl::StrCat(absl::StrJoin(names, ", "), linears.size() > names.size() ? ", ..." : "");
}

}  // namespace

int64_t AdapterParameters(const LinearModule& module, int64_t dim) {
  return dim * (module.in_features + module.out_features);
}

absl::StatusOr<bool> PatternMatches(absl::string_view pattern, absl::string_view name) {
  if (pattern == name) return true;
  try {
    const std::regex regex(WildcardRegex(pattern));
    return std::regex_match(name.begin(), name.end(), regex);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("peft pattern \"", pattern, "\" is not a pattern: ", e.what()));
  }
}

absl::StatusOr<std::vector<LinearModule>> SelectLinearModules(const torch::nn::Module& model,
                                                              const LoraOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckLoraOptions(options));
  const std::vector<LinearModule> linears = LinearModules(model);
  if (options.match_all_linear) return linears;
  const bool excluding = !options.exclude_modules.empty();
  const std::vector<std::string> patterns =
      excluding ? options.exclude_modules : TargetPatterns(options);
  std::vector<bool> matched(linears.size(), false);
  for (const std::string& pattern : patterns) {
    bool any = false;
    for (size_t i = 0; i < linears.size(); ++i) {
      KEEL_ASSIGN_OR_RETURN(const bool match, PatternMatches(pattern, linears[i].name));
      any = any || match;
      matched[i] = matched[i] || match;
    }
    if (!any) {
      return absl::InvalidArgumentError(
          absl::StrCat("peft.", excluding ? "exclude_modules" : "target_modules", " pattern \"",
                       pattern, "\" matches none of the model's ", linears.size(),
                       " linear layers, which are named like: ", SomeNames(linears),
                       " ('*' stands for any characters; a pattern matches whole names)"));
    }
  }
  std::vector<LinearModule> selected;
  for (size_t i = 0; i < linears.size(); ++i) {
    if (matched[i] != excluding) selected.push_back(linears[i]);
  }
  return selected;
}

}  // namespace keel::peft
