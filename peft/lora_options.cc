#include "peft/lora_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/enum.h"

namespace keel::peft {
namespace {

constexpr base::EnumSpelling<DropoutPosition> kDropoutPositions[] = {
    {DropoutPosition::kPost, "post"}, {DropoutPosition::kPre, "pre"}};
constexpr base::EnumSpelling<LoraAInit> kLoraAInits[] = {{LoraAInit::kXavier, "xavier"},
                                                         {LoraAInit::kUniform, "uniform"}};
constexpr base::EnumSpelling<LoraDtype> kLoraDtypes[] = {{LoraDtype::kBase, "base"},
                                                         {LoraDtype::kFloat32, "float32"},
                                                         {LoraDtype::kBFloat16, "bfloat16"}};

std::string Quoted(const std::vector<std::string>& patterns) {
  return absl::StrCat("[\"", absl::StrJoin(patterns, "\", \""), "\"]");
}

}  // namespace

bool AbslParseFlag(absl::string_view text, DropoutPosition* out, std::string* error) {
  return base::ParseEnum(kDropoutPositions, text, out, error);
}
std::string AbslUnparseFlag(DropoutPosition position) {
  return std::string(base::EnumName(kDropoutPositions, position));
}
bool AbslParseFlag(absl::string_view text, LoraAInit* out, std::string* error) {
  return base::ParseEnum(kLoraAInits, text, out, error);
}
std::string AbslUnparseFlag(LoraAInit init) {
  return std::string(base::EnumName(kLoraAInits, init));
}

bool AbslParseFlag(absl::string_view text, LoraDtype* out, std::string* error) {
  return base::ParseEnum(kLoraDtypes, text, out, error);
}
std::string AbslUnparseFlag(LoraDtype dtype) {
  return std::string(base::EnumName(kLoraDtypes, dtype));
}

std::vector<std::string> TargetPatterns(const LoraOptions& options) {
  if (options.target_modules.empty() && options.exclude_modules.empty() &&
      !options.match_all_linear) {
    return {"*_proj"};
  }
  return options.target_modules;
}

absl::Status CheckLoraOptions(const LoraOptions& o) {
  if (!o.target_modules.empty() && !o.exclude_modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peft.target_modules (", Quoted(o.target_modules), ") and peft.exclude_modules (",
        Quoted(o.exclude_modules), ") are exclusive; set one"));
  }
  if (o.match_all_linear && (!o.target_modules.empty() || !o.exclude_modules.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("peft.match_all_linear (true) selects every linear layer; allowed with it: "
                     "peft.target_modules and peft.exclude_modules unset (set: ",
                     Quoted(o.target_modules.empty() ? o.exclude_modules : o.target_modules), ")"));
  }
  for (const auto& [field, patterns] :
       {std::pair{"target_modules", &o.target_modules}, {"exclude_modules", &o.exclude_modules}}) {
    for (const std::string& pattern : *patterns) {
      if (pattern.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("peft.", field, " (", Quoted(*patterns), ") holds an empty pattern"));
      }
    }
  }
  if (o.dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("peft.dim (", o.dim, ") is the adapters' rank; allowed: >= 1"));
  }
  if (!(o.alpha > 0) || !std::isfinite(o.alpha)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peft.alpha (", o.alpha, ") scales the adapters by alpha / dim; allowed: > 0"));
  }
  if (!(o.dropout >= 0 && o.dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("peft.dropout (", o.dropout, ") is a probability; allowed: [0, 1)"));
  }
  return absl::OkStatus();
}

}  // namespace keel::peft
