// LoRA adapters on Keel's tensor-parallel linear layers, as NeMo AutoModel's LinearLoRA
// (nemo_automodel/components/_peft/lora.py) computes them: y = base(x) + B(A(x) * alpha / dim),
// B zero at the start, A drawn by lora_A_init, dropout on A's input ("pre") or on the adapter's
// output ("post"). The placements are torchtitan's: on a column-parallel layer A is whole and B
// split like the layer's rows; on a row-parallel layer A is split along its input like the
// layer and B whole. Each adapter reports its parameters' layouts (parallel::LaidOut); under
// the layer's sequence parallelism, a column layer's A and a row layer's B get their gradient
// from this rank's share of the sequence only (parallel::SequenceSplit).
//
//   KEEL_ASSIGN_OR_RETURN(auto adapted, keel::peft::SelectLinearModules(*model, options));
//   KEEL_RETURN_IF_ERROR(keel::peft::AttachLoraAdapters(*model, adapted, options));
//   // model's own parameters are frozen; "<layer>.adapter.lora_A" and ".lora_B" train
#ifndef KEEL_PEFT_LORA_ADAPTER_H_
#define KEEL_PEFT_LORA_ADAPTER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "parallel/tensor_parallel/layers.h"
#include "peft/lora_options.h"
#include "peft/module_matcher.h"

namespace keel::peft {

// One linear layer's adapter. forward is parallel::LinearAdapter's contract.
class LoraAdapterImpl : public parallel::LinearAdapter,
                        public parallel::LaidOut,
                        public parallel::SequenceSplit {
 public:
  // An adapter of `options` for `layer` (whose tp group it shares): A [dim, in] and B [out, dim]
  // of the whole layer, this rank holding its blocks; both zero (AttachLoraAdapters draws A), on
  // the layer's weight's device, in its dtype or options.lora_dtype.
  LoraAdapterImpl(const parallel::ColumnParallelLinearImpl& layer, const LoraOptions& options);
  LoraAdapterImpl(const parallel::RowParallelLinearImpl& layer, const LoraOptions& options);

  at::Tensor forward(const at::Tensor& input) override;
  std::map<std::string, parallel::TensorLayout> LocalLayouts() const override;
  std::vector<std::string> LocalSequenceParallelParameters() const override;
  // Draws A whole from the default generator by options.lora_A_init (torch's xavier_normal_,
  // or kaiming_uniform_ with a = sqrt(5)) and keeps this rank's block.
  void InitialiseA();

 private:
  LoraAdapterImpl(bool column, int64_t input_size, int64_t output_size, c10d::ProcessGroup* tp,
                  bool sequence_parallel, const at::Tensor& weight, const LoraOptions& options);

  bool column_;
  int64_t input_size_, output_size_;
  c10d::ProcessGroup* tp_;
  bool sequence_parallel_;
  LoraOptions options_;
  at::Tensor lora_A_, lora_B_;
};

// Attaches an adapter to each of `modules` of `model` and freezes every other parameter of
// `model` (requires_grad false). `modules` are SelectLinearModules's of the one-rank model (with
// its whole shapes): each A is drawn whole from the default generator, in their order, and this
// rank keeps its block; a module `model` does not hold (another pipeline stage's) has its A
// drawn and dropped. So every layout starts from the weights of one rank. Errors:
// kInvalidArgument naming a module that is not a linear layer of `model` or already has an
// adapter; kResourceExhausted, naming r, when the adapters cannot be allocated.
[[nodiscard]] absl::Status AttachLoraAdapters(torch::nn::Module& model,
                                              const std::vector<LinearModule>& modules,
                                              const LoraOptions& options);

}  // namespace keel::peft

#endif  // KEEL_PEFT_LORA_ADAPTER_H_
