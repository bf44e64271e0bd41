#include "peft/lora_adapter.h"

#include <cmath>
#include <memory>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "parallel/parameters.h"
#include "parallel/tensor_parallel/mappings.h"
#include "torch/nn/init.h"

namespace keel::peft {

namespace {

// The weight of a linear layer (where its adapter lives, and in what dtype by default).
at::Tensor WeightOf(const torch::nn::Module& layer) {
  return layer.named_parameters(/*recurse=*/false)["weight"];
}

// A's whole values, drawn from the default generator by `init` on the CPU in float32.
at::Tensor DrawA(int64_t dim, int64_t input_size, LoraAInit init) {
  at::NoGradGuard no_grad;
  at::Tensor whole = at::empty({dim, input_size}, at::kFloat);
  if (init == LoraAInit::kXavier) {
    torch::nn::init::xavier_normal_(whole);
  } else {
    torch::nn::init::kaiming_uniform_(whole, std::sqrt(5.0));
  }
  return whole;
}

}  // namespace

LoraAdapterImpl::LoraAdapterImpl(const parallel::ColumnParallelLinearImpl& layer,
                                 const LoraOptions& options)
    : LoraAdapterImpl(/*column=*/true, layer.input_size(), layer.output_size(), layer.tp(),
                      layer.sequence_parallel(), WeightOf(layer), options) {}

LoraAdapterImpl::LoraAdapterImpl(const parallel::RowParallelLinearImpl& layer,
                                 const LoraOptions& options)
    : LoraAdapterImpl(/*column=*/false, layer.input_size(), layer.output_size(), layer.tp(),
                      layer.sequence_parallel(), WeightOf(layer), options) {}

LoraAdapterImpl::LoraAdapterImpl(bool column, int64_t input_size, int64_t output_size,
                                 c10d::ProcessGroup* tp, bool sequence_parallel,
                                 const at::Tensor& weight, const LoraOptions& options)
    : column_(column),
      input_size_(input_size),
      output_size_(output_size),
      tp_(tp),
      sequence_parallel_(sequence_parallel),
      options_(options) {
  const int64_t n = base::GroupSize(tp);
  const at::ScalarType dtype = options.lora_dtype == LoraDtype::kFloat32    ? at::kFloat
                               : options.lora_dtype == LoraDtype::kBFloat16 ? at::kBFloat16
                                                                            : weight.scalar_type();
  const at::TensorOptions placed = weight.options().dtype(dtype);
  lora_A_ = register_parameter(
      "lora_A",
      parallel::NewParameter({options.dim, column ? input_size : input_size / n}).to(placed));
  lora_B_ = register_parameter(
      "lora_B",
      parallel::NewParameter({column ? output_size / n : output_size, options.dim}).to(placed));
}

at::Tensor LoraAdapterImpl::forward(const at::Tensor& input) {
  const double p = options_.dropout;
  const bool pre = options_.dropout_position == DropoutPosition::kPre;
  // With peft.lora_dtype the adapter computes in its own dtype, its output back in the layer's.
  const at::Tensor cast = input.to(lora_A_.scalar_type());
  const at::Tensor x = p > 0 && pre ? at::dropout(cast, p, is_training()) : cast;
  at::Tensor h = at::linear(x, lora_A_) * (options_.alpha / static_cast<double>(options_.dim));
  // Column: A is whole, so its gradient sums every rank's part of B's. Row: each rank's A holds
  // part of the sum h, which B needs whole. Under sequence parallelism the input of a column
  // layer is this rank's share of the sequence, whose h B gathers, and a row layer's output is
  // its share: A's or B's gradient is then this rank's part (LocalSequenceParallelParameters).
  if (column_) {
    h = sequence_parallel_ ? parallel::GatherFromSequenceParallelRegion(h, tp_)
                           : parallel::CopyToTensorParallelRegion(h, tp_);
  } else {
    h = sequence_parallel_ ? parallel::ReduceScatterToSequenceParallelRegion(h, tp_)
                           : parallel::ReduceFromTensorParallelRegion(h, tp_);
  }
  const at::Tensor out = at::linear(h, lora_B_);
  return (p > 0 && !pre ? at::dropout(out, p, is_training()) : out).to(input.scalar_type());
}

std::map<std::string, parallel::TensorLayout> LoraAdapterImpl::LocalLayouts() const {
  if (base::GroupSize(tp_) <= 1) return {};
  if (column_) return {{"lora_B", parallel::ShardedOverTp(tp_, {output_size_, options_.dim}, 0)}};
  return {{"lora_A", parallel::ShardedOverTp(tp_, {options_.dim, input_size_}, 1)}};
}

std::vector<std::string> LoraAdapterImpl::LocalSequenceParallelParameters() const {
  if (!sequence_parallel_) return {};
  return {column_ ? "lora_A" : "lora_B"};
}

void LoraAdapterImpl::InitialiseA() {
  const at::Tensor whole = DrawA(options_.dim, input_size_, options_.lora_A_init);
  const int64_t local = lora_A_.size(1);
  at::NoGradGuard no_grad;
  lora_A_.copy_(column_ ? whole : whole.narrow(1, base::GroupRank(tp_) * local, local));
}

namespace {

// AttachLoraAdapters, but for LibTorch's exceptions (an adapter too large to allocate).
absl::Status Attach(torch::nn::Module& model, const std::vector<LinearModule>& modules,
                    const LoraOptions& options) {
  for (at::Tensor& parameter : model.parameters()) parameter.set_requires_grad(false);
  const auto named = model.named_modules("", /*include_self=*/false);
  for (const LinearModule& module : modules) {
    const std::shared_ptr<torch::nn::Module>* found = named.find(module.name);
    if (found == nullptr) {  // another pipeline stage's: its A's draw, dropped
      DrawA(options.dim, module.in_features, options.lora_A_init);
      continue;
    }
    torch::nn::Module* const layer = found->get();
    std::shared_ptr<LoraAdapterImpl> adapter;
    if (layer->named_children().contains("adapter")) {
      return absl::InvalidArgumentError(
          absl::StrCat("peft: ", module.name, " already has an adapter"));
    }
    if (auto* column = dynamic_cast<parallel::ColumnParallelLinearImpl*>(layer)) {
      adapter = std::make_shared<LoraAdapterImpl>(*column, options);
      column->Adapt(adapter);
    } else if (auto* row = dynamic_cast<parallel::RowParallelLinearImpl*>(layer)) {
      adapter = std::make_shared<LoraAdapterImpl>(*row, options);
      row->Adapt(adapter);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("peft: ", module.name, " is not a linear layer of the model"));
    }
    adapter->InitialiseA();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AttachLoraAdapters(torch::nn::Module& model, const std::vector<LinearModule>& modules,
                                const LoraOptions& options) {
  absl::Status attached;
  KEEL_RETURN_IF_ERROR(
      base::CallTorch(absl::StatusCode::kResourceExhausted,
                      absl::StrCat("attaching the LoRA adapters of r ", options.dim),
                      [&] { attached = Attach(model, modules, options); }));
  return attached;
}

}  // namespace keel::peft
