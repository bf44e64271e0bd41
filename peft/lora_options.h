// LoRA's options with NeMo AutoModel's PeftConfig names and defaults
// (nemo_automodel/components/_peft/lora.py), and their checks.
//
//   keel::peft::LoraOptions options;  // '*_proj', dim 8, alpha 32: the scale is 32 / 8 = 4
//   options.dim = 16;
//   KEEL_RETURN_IF_ERROR(keel::peft::CheckLoraOptions(options));
#ifndef KEEL_PEFT_LORA_OPTIONS_H_
#define KEEL_PEFT_LORA_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"

namespace keel::peft {

// Where the adapter's dropout acts: on its output (AutoModel's default) or on its input (peft's).
enum class DropoutPosition { kPost, kPre };
bool AbslParseFlag(absl::string_view text, DropoutPosition* out, std::string* error);
std::string AbslUnparseFlag(DropoutPosition position);

// How A starts: torch's xavier_normal_, or kaiming_uniform_(a = sqrt(5)) (nn.Linear's own). B
// starts at zero either way.
enum class LoraAInit { kXavier, kUniform };
bool AbslParseFlag(absl::string_view text, LoraAInit* out, std::string* error);
std::string AbslUnparseFlag(LoraAInit init);

// The adapters' dtype: the adapted layer's (AutoModel's lora_dtype None), or float32 or bfloat16
// whatever the layer's (the adapter then computes in its own dtype: its input is cast to it and
// its output back to the layer's).
enum class LoraDtype { kBase, kFloat32, kBFloat16 };
bool AbslParseFlag(absl::string_view text, LoraDtype* out, std::string* error);
std::string AbslUnparseFlag(LoraDtype dtype);

struct LoraOptions {
  // Patterns over a linear layer's full module name ("model.layers.0.self_attn.q_proj"), '*' any
  // characters, anchored at both ends (AutoModel's ModuleMatcher). With none of the three
  // selectors set: {"*_proj"}. Default: empty.
  std::vector<std::string> target_modules;
  // Every linear layer but these patterns' (exclusive with target_modules). Default: empty.
  std::vector<std::string> exclude_modules;
  // Every linear layer, lm_head included (exclusive with the two lists). Default: false.
  bool match_all_linear = false;
  // The adapter's rank r. Default: 8.
  int64_t dim = 8;
  // The adapter's output is scaled by alpha / dim. Default: 32.
  double alpha = 32;
  // Dropout probability, in [0, 1). Default: 0.
  double dropout = 0.0;
  // Default: kPost.
  DropoutPosition dropout_position = DropoutPosition::kPost;
  // Default: kXavier.
  LoraAInit lora_A_init = LoraAInit::kXavier;
  // Default: kBase.
  LoraDtype lora_dtype = LoraDtype::kBase;
};

template <typename O, typename V, base::IsFieldsOf<O, LoraOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("target_modules", o.target_modules);
  v("exclude_modules", o.exclude_modules);
  v("match_all_linear", o.match_all_linear);
  v("dim", o.dim);
  v("alpha", o.alpha);
  v("dropout", o.dropout);
  v("dropout_position", o.dropout_position);
  v("lora_A_init", o.lora_A_init);
  v("lora_dtype", o.lora_dtype);
}

// The patterns the options select by: target_modules, or {"*_proj"} when no selector is set.
std::vector<std::string> TargetPatterns(const LoraOptions& options);

// Errors: kInvalidArgument naming the field ("peft.<name>"), its value and what is allowed: two
// selectors set together, an empty pattern, dim < 1, alpha <= 0, dropout outside [0, 1).
[[nodiscard]] absl::Status CheckLoraOptions(const LoraOptions& options);

}  // namespace keel::peft

#endif  // KEEL_PEFT_LORA_OPTIONS_H_
