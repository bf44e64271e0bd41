#include "tools/recipe/memory.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/language_model.h"

namespace keel::tools::recipe {
namespace {

constexpr int64_t kFloat32 = 4;
constexpr int64_t kBf16 = 2;

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

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
    const bool in_fp32 = MainGradientsInFloat32(options.distributed);
    memory.weight_bytes = kBf16 * all;
    memory.gradient_bytes = (in_fp32 ? kFloat32 : kBf16) * all;
    memory.main_param_bytes = kFloat32 * stepped;
    // Sharded: float32 buckets cannot carry the bf16 parameters' all-gather.
    if (sharded && in_fp32) memory.buffer_bytes = kBf16 * reduced;
  } else {
    memory.weight_bytes = kFloat32 * all;
    memory.gradient_bytes = kFloat32 * all;
    // Sharded: the buckets are the gradients (backward adds into them; no .grad beside them).
    if (!sharded) memory.buffer_bytes = kFloat32 * reduced;
  }
  return memory;
}

RankActivations EstimateRankActivations(const TrainOptions& options,
                                        const parallel::MeshLayout& layout) {
  const parallel::ModelParallelOptions& sizes = layout.options();
  const int64_t pp = sizes.pipeline_model_parallel_size;
  const int64_t micro_batches =
      std::max<int64_t>(1, options.step_scheduler.global_batch_size /
                               (options.local_batch_size * layout.data_parallel_size()));
  models::ActivationShape shape;
  shape.micro_batch_size = options.local_batch_size;
  shape.sequence_length = options.packed_sequence.packed_sequence_size > 0
                              ? options.packed_sequence.packed_sequence_size
                              : options.data.dataset.sequence_length;
  shape.activation_bytes = options.bf16 ? kBf16 : kFloat32;
  shape.gpu = options.distributed.backend == parallel::Backend::kNccl;
  shape.tensor_parallel_size = sizes.tensor_model_parallel_size;
  shape.sequence_parallel = options.distributed.sequence_parallel;
  RankActivations most;
  for (int64_t stage = 0; stage < pp; ++stage) {
    shape.layers = models::StageLayersOf(options.model.num_layers, pp, stage).count;
    shape.last_stage = stage == pp - 1;
    RankActivations here;
    here.stage = stage;
    here.micro_batches_in_flight = std::min(pp - stage, micro_batches);
    here.memory = models::EstimateActivations(options.model, shape);
    if (stage == 0 || here.peak_bytes() > most.peak_bytes()) most = here;
  }
  return most;
}

namespace {

// "full recomputation (uniform, 2 layers a chunk)", "selective recomputation (core_attn)",
// "no recomputation".
std::string DescribeRecompute(const parallel::RecomputeOptions& recompute) {
  if (!recompute.recompute_granularity.has_value()) return "no recomputation";
  if (*recompute.recompute_granularity == parallel::RecomputeGranularity::kSelective) {
    return absl::StrCat("selective recomputation (",
                        absl::StrJoin(recompute.recompute_modules, ", "), ")");
  }
  return absl::StrCat("full recomputation (",
                      parallel::AbslUnparseFlag(*recompute.recompute_method), ", ",
                      *recompute.recompute_num_layers, " layer(s))");
}

void PrintActivations(const TrainOptions& options, const parallel::MeshLayout& layout,
                      std::ostream& out) {
  const RankActivations a = EstimateRankActivations(options, layout);
  const models::ActivationMemory& m = a.memory;
  const int64_t chunk_len = models::CrossEntropyChunkLen(options.model);
  out << "activations per rank";
  if (layout.options().pipeline_model_parallel_size > 1)
    out << " (pipeline stage " << a.stage << ")";
  out << ": a layer keeps " << Mib(m.layer_bytes) << " a micro-batch; with "
      << DescribeRecompute(options.model.recompute) << " the stage keeps " << Mib(m.kept_bytes);
  if (m.recomputed_bytes > 0) out << " (" << Mib(m.recomputed_bytes) << " made again at once)";
  if (m.head_kept_bytes > 0) {
    out << ", the loss " << Mib(m.head_kept_bytes) << " with logits at most "
        << Mib(m.logits_peak_bytes)
        << (chunk_len > 0 ? absl::StrCat(" (chunks of ", chunk_len, " positions)")
                          : std::string(" (whole)"));
  }
  out << "; " << a.micro_batches_in_flight << " micro-batch(es) in flight: about "
      << Mib(a.peak_bytes())
      << " at a step's peak (Korthikanti et al.'s count over Keel's layers)\n";
}

}  // namespace

absl::Status CheckModelStateFits(const TrainOptions& options, const parallel::MeshLayout& layout,
                                 const MemoryCapacity& capacity) {
  const RankMemory m = EstimateRankMemory(options, layout);
  const int64_t built_on_host = kFloat32 * (m.parameters.dense + m.parameters.experts);
  const int ranks = std::max(1, capacity.ranks_on_host);
  // "this machine (RAM and swap) holds 23.5 GiB, 5.9 GiB for each of its 4 ranks"
  const auto host = [&](int64_t bytes) {
    std::string held = absl::StrCat("this machine (RAM and swap) holds ", Gib(bytes));
    if (ranks > 1)
      absl::StrAppend(&held, ", ", Gib(bytes / ranks), " for each of its ", ranks, " ranks");
    return held;
  };
  const auto refuse = [&](const std::string& needs, int64_t bytes, const std::string& held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "one rank's ", needs, " take ", Gib(bytes), " (", m.parameters.dense + m.parameters.experts,
        " parameters; --dry_run shows the figures), but ", held,
        "; allowed: a model state within it: fewer or narrower layers (model.num_layers, "
        "hidden_size, ffn_hidden_size, vocab_size), or each rank's share made smaller "
        "(distributed.tensor_model_parallel_size, pipeline_model_parallel_size, "
        "use_distributed_optimizer, peft)",
        ranks > 1 ? ", or fewer ranks on this machine" : ""));
  };
  const std::string state =
      options.peft.has_value() ? "frozen weights" : "weights, gradients and optimizer state";
  if (capacity.device.is_cpu()) {
    if (capacity.device_bytes > 0 && m.total_bytes() > capacity.device_bytes / ranks) {
      return refuse(state, m.total_bytes(), host(capacity.device_bytes));
    }
  } else if (capacity.device_bytes > 0 && m.total_bytes() > capacity.device_bytes) {
    return refuse(state, m.total_bytes(),
                  absl::StrCat(capacity.device.str(), " holds ", Gib(capacity.device_bytes)));
  }
  if (capacity.host_bytes > 0 && built_on_host > capacity.host_bytes / ranks) {
    return refuse("weights, built in float32 on the CPU before they go to the device,",
                  built_on_host, host(capacity.host_bytes));
  }
  return absl::OkStatus();
}

void PrintPrecisionAndMemory(const TrainOptions& options, const parallel::MeshLayout& layout,
                             std::ostream& out) {
  if (options.bf16) {
    out << "precision: bf16 parameters and activations; main gradients in "
        << (MainGradientsInFloat32(options.distributed) ? "float32" : "bf16")
        << (FusesGradientAccumulation(options.distributed)
                ? " (the linear layers' weight gradients added from their GEMMs)"
                : "")
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
    PrintActivations(options, layout, out);
    return;
  }
  out << "; weights " << Mib(m.weight_bytes) << ", gradients " << Mib(m.gradient_bytes);
  if (m.main_param_bytes > 0) out << ", main parameters " << Mib(m.main_param_bytes);
  out << ", optimizer state " << Mib(m.optimizer_bytes);
  if (m.buffer_bytes > 0) out << ", communication buffers " << Mib(m.buffer_bytes);
  out << ": " << Mib(m.total_bytes()) << " before activations\n";
  PrintActivations(options, layout, out);
}

}  // namespace keel::tools::recipe
