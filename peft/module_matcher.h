// Which linear layers of a model get LoRA adapters: NeMo AutoModel's ModuleMatcher
// (nemo_automodel/components/_peft/module_matcher.py) over Keel's linear layers
// (parallel::ColumnParallelLinear and RowParallelLinear), by full module name.
//
//   KEEL_ASSIGN_OR_RETURN(std::vector<keel::peft::LinearModule> adapted,
//                         keel::peft::SelectLinearModules(*model, options));
//   // "*_proj" on a Llama: model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.*_proj
#ifndef KEEL_PEFT_MODULE_MATCHER_H_
#define KEEL_PEFT_MODULE_MATCHER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "peft/lora_options.h"
#include "torch/nn/module.h"

namespace keel::peft {

// Whether `pattern` matches the full module name `name` as AutoModel's wildcard_match does: the
// whole name, '*' any characters, the other characters as in a regular expression ('.' any one),
// or the name itself. Errors: kInvalidArgument for a pattern that is no regular expression.
[[nodiscard]] absl::StatusOr<bool> PatternMatches(absl::string_view pattern,
                                                  absl::string_view name);

// A linear layer of a model, with its weight's shape on this rank.
struct LinearModule {
  std::string name;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

// The parameters of `module`'s adapter of rank `dim`: A [dim, in] and B [out, dim].
int64_t AdapterParameters(const LinearModule& module, int64_t dim);

// The linear layers of `model` that `options` selects, in the model's order: with
// match_all_linear all of them, with exclude_modules those no pattern matches, else those a
// pattern of TargetPatterns(options) matches. Errors: kInvalidArgument naming a pattern that
// matches none of the model's linear layers (listing a few of their names) or is no pattern;
// CheckLoraOptions's.
[[nodiscard]] absl::StatusOr<std::vector<LinearModule>> SelectLinearModules(
    const torch::nn::Module& model, const LoraOptions& options);

}  // namespace keel::peft

#endif  // KEEL_PEFT_MODULE_MATCHER_H_
