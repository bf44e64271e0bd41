#include "tools/recipe/memory.h"

#include "absl/strings/str_format.h"

namespace keel::tools::recipe {
namespace {

constexpr int64_t kFloat32 = 4;
constexpr int64_t kBf16 = 2;

}  // namespace

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

RankMemory EstimateRankMemory(const TrainOptions& options, const parallel::MeshLayout& layout) {
  const parallel::ModelParallelOptions& sizes = layout.options();
  RankMemory memory;
  for (int64_t stage = 0; stage < sizes.pipeline_model_parallel_size; ++stage) {
    const models::StageParameters count = models::CountStageParameters(options.model, sizes, stage);
    if (stage == 0 ||
        count.dense + count.experts > memory.parameters.dense + memory.parameters.experts) {
      memory.stage = stage;
      memory.parameters = count;
    }
  }
  const int64_t dense = memory.parameters.dense, experts = memory.parameters.experts;
  const int64_t all = dense + experts;
  if (options.peft.has_value()) {  // frozen: the adapters' state is the peft lines'
    memory.weight_bytes = (options.bf16 ? kBf16 : kFloat32) * all;
    return memory;
  }
  const int64_t dp = layout.data_parallel_size();
  const int64_t expert_dp = layout.expert_data_parallel_size();
  // The elements of this rank's optimizer state: all of them, or its shards.
  const bool sharded = options.distributed.use_distributed_optimizer;
  const int64_t stepped = sharded ? dense / dp + experts / expert_dp : all;
  // Parameters whose gradients are reduced over more than one rank.
  const int64_t reduced = (dp > 1 ? dense : 0) + (expert_dp > 1 ? experts : 0);
  memory.optimizer_bytes = 2 * kFloat32 * stepped;
  if (options.bf16) {
    const bool in_fp32 = options.distributed.grad_reduce_in_fp32.value_or(true);
    memory.weight_bytes = kBf16 * all;
    memory.gradient_bytes = (in_fp32 ? kFloat32 : kBf16) * all;
    memory.main_param_bytes = kFloat32 * stepped;
    // Sharded: float32 buckets cannot carry the bf16 parameters' all-gather.
    if (sharded && in_fp32) memory.buffer_bytes = kBf16 * reduced;
  } else {
    memory.weight_bytes = kFloat32 * all;
    memory.gradient_bytes = kFloat32 * all;
    memory.buffer_bytes = kFloat32 * reduced;
  }
  return memory;
}

void PrintPrecisionAndMemory(const TrainOptions& options, const parallel::MeshLayout& layout,
                             std::ostream& out) {
  if (options.bf16) {
    out << "precision: bf16 parameters and activations; main gradients in "
        << (options.distributed.grad_reduce_in_fp32.value_or(true) ? "float32" : "bf16")
        << ", float32 main parameters and AdamW state (Megatron's bf16)\n";
  } else {
    out << "precision: float32" << (options.tf32 ? " (matrix products in TF32)" : "") << "\n";
  }
  const RankMemory m = EstimateRankMemory(options, layout);
  const int64_t pp = layout.options().pipeline_model_parallel_size;
  out << "memory per rank";
  if (pp > 1) out << " (pipeline stage " << m.stage << " of " << pp << ", the largest)";
  out << ": " << m.parameters.dense + m.parameters.experts << " parameters";
  if (m.parameters.experts > 0) out << " (" << m.parameters.experts << " of experts)";
  if (options.peft.has_value()) {
    out << "; frozen weights " << Mib(m.weight_bytes)
        << " (no gradients, no optimizer state), plus the LoRA adapters' (below) before "
           "activations\n";
    return;
  }
  out << "; weights " << Mib(m.weight_bytes) << ", gradients " << Mib(m.gradient_bytes);
  if (m.main_param_bytes > 0) out << ", main parameters " << Mib(m.main_param_bytes);
  out << ", optimizer state " << Mib(m.optimizer_bytes);
  if (m.buffer_bytes > 0) out << ", communication buffers " << Mib(m.buffer_bytes);
  out << ": " << Mib(m.total_bytes()) << " before activations\n";
}

}  // namespace keel::tools::recipe
