// A model as a Stateful, after NeMo AutoModel's ModelState and its key helpers
// _drop_outer_prefix / _add_outer_prefix (nemo_automodel/components/checkpoint/
// stateful_wrappers.py): parameters and buffers by fully qualified name, a tied weight (the
// lm_head tied to the input embedding) once, PEFT's trainable parameters under "base_model.model.",
// and Hugging Face keys (no outer "model.") for safetensors.
//
//   keel::checkpoint::ModelStateOptions options;
//   options.model_save_format = keel::checkpoint::SerializationFormat::kSafetensors;
//   keel::checkpoint::ModelState model_state(*model, options);
//   KEEL_ASSIGN_OR_RETURN(auto report, LoadFromMemory({{"model", &model_state}}, saved, {}));
#ifndef KEEL_CHECKPOINT_MODEL_STATE_H_
#define KEEL_CHECKPOINT_MODEL_STATE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/state_dict.h"
#include "parallel/layout.h"
#include "torch/nn/module.h"

namespace keel::checkpoint {

// The outer prefix of PEFT checkpoints (PeftModel's "base_model.model.").
inline constexpr absl::string_view kPeftPrefix = "base_model.model.";
// The outer prefix that Hugging Face safetensors keys do not carry.
inline constexpr absl::string_view kHfModelPrefix = "model.";

// _drop_outer_prefix: each key that starts with `prefix` loses that leading occurrence only
// ("model.model.x" -> "model.x"); other keys are kept. The result is in the order of `keys`.
std::vector<std::string> DropOuterPrefix(const std::vector<std::string>& keys,
                                         absl::string_view prefix);

// _add_outer_prefix: each key that neither starts with `prefix` nor is in `skip_keys` gets
// `prefix` in front; other keys are kept. The result is in the order of `keys`.
std::vector<std::string> AddOuterPrefix(const std::vector<std::string>& keys,
                                        absl::string_view prefix,
                                        const std::vector<std::string>& skip_keys = {});

struct ModelStateOptions {
  // Shard file format (NeMo's model_save_format); kSafetensors without is_peft drops the
  // outer "model." from the keys (Hugging Face layout). Default: kKeel.
  SerializationFormat model_save_format = SerializationFormat::kKeel;
  // Save and load only trainable (requires_grad) parameters, under "base_model.model.".
  // Default: false.
  bool is_peft = false;
  // Blocks of sharded parameters or buffers, by fully qualified name; others are whole.
  // Default: empty.
  std::map<std::string, parallel::TensorLayout> layouts;
  // Parameters saved and loaded through another tensor, by fully qualified name: a bf16
  // model's float32 main copies (optim::DataParallelOptimizer::StepParameters, with their
  // layouts, which replace those of `layouts`), so that the checkpoint holds the float32
  // values the optimizer steps, Megatron's main parameters, and loads into them. Default: empty.
  std::map<std::string, TensorRef> stand_ins;
};

// The model's parameters and buffers by fully qualified name (Module::named_parameters and
// named_buffers). A parameter registered under several names (an lm_head tied to the input
// embedding) is saved and read once, under its first name, as Python's named_parameters()
// gives it (base/named_parameters.h); loading it refills every name, since loads copy in place.
//
// Keys: the name as is; with is_peft, AddOuterPrefix(name, "base_model.model."); with
// kSafetensors (not is_peft), DropOuterPrefix(name, "model."). A load looks every tensor up
// under the key StateDict gives it, which for usual models is what the reference's load
// (_drop_outer_prefix / _add_outer_prefix with the model's unprefixed keys as skip_keys)
// computes, and unlike it also round-trips names such as "model.model.x".
//
// With is_peft, frozen parameters and buffers are neither saved nor touched by a load (the
// reference's non-strict load); a trainable parameter absent from the checkpoint is reported
// missing, as DCP's planner does.
class ModelState : public Stateful {
 public:
  // Requires: `model` outlives this object.
  explicit ModelState(torch::nn::Module& model, ModelStateOptions options = {});

  // Errors: kInvalidArgument when a layout or stand-in names no parameter or buffer of the
  // model, or two names give the same key (e.g. "model.x" and "x" in the safetensors layout).
  [[nodiscard]] absl::StatusOr<State> StateDict() const override;
  // Reads every tensor StateDict would save, in place. Errors: those of StateDict, and of
  // StateReader::ReadTensor.
  [[nodiscard]] absl::Status LoadStateDict(StateReader& reader) override;

  // The key each repeated name of a parameter would have (StateDict leaves them out), mapped to
  // the key of its first name: {"lm_head.weight": "wte.weight"}.
  std::map<std::string, std::string> TiedKeys() const;

 private:
  struct Entry {
    std::string key;
    at::Tensor tensor;
    std::optional<parallel::TensorLayout> layout;
  };
  absl::StatusOr<std::vector<Entry>> Entries() const;
  // The keys of these parameter or buffer names (is_peft and model_save_format).
  std::vector<std::string> Keys(const std::vector<std::string>& names) const;

  torch::nn::Module* model_;
  ModelStateOptions options_;
};

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_MODEL_STATE_H_
