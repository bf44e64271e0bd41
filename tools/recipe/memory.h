// What one rank's model state takes on its device, from the configuration alone (the trainer's
// --dry_run): the weights, the gradients, the float32 main parameters of a bf16 run, AdamW's
// two moments and the communication buffers, for the pipeline stage that holds the most, as
// the trainer allocates them (gradients::DataParallelGradSync's buckets, optim's main copies
// and shards); and its activations (models/activation_memory.h) for the micro-batch, the
// recomputation and the loss the configuration chooses.
//
//   PrintPrecisionAndMemory(options, layout, std::cout);
//   KEEL_RETURN_IF_ERROR(CheckModelStateFits(
//       options, layout, {device, base::DeviceMemoryCapacity(device),
//                         base::DeviceMemoryCapacity(at::kCPU), env.local_world_size}));
#ifndef KEEL_TOOLS_RECIPE_MEMORY_H_
#define KEEL_TOOLS_RECIPE_MEMORY_H_

#include <cstdint>
#include <ostream>

#include "absl/status/status.h"
#include "c10/core/Device.h"
#include "models/activation_memory.h"
#include "models/registry.h"
#include "parallel/mesh_layout.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {

struct RankMemory {
  // The stage whose ranks hold the most (the first of equals), and its parameters per rank.
  int64_t stage = 0;
  models::StageParameters parameters;
  // Bytes: the parameters in their dtype; their gradients (float32 .grad, or a bf16 run's main
  // gradients in distributed.grad_reduce_in_fp32's dtype); a bf16 run's float32 main
  // parameters (this rank's shard with the distributed optimizer); AdamW's exp_avg and
  // exp_avg_sq in float32 (sharded alike); the copies for communication (an unsharded float32
  // run's all-reduce buckets with more than one data-parallel rank, a sharded bf16 run's
  // parameter all-gather buffer).
  int64_t weight_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t main_param_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t buffer_bytes = 0;

  int64_t total_bytes() const {
    return weight_bytes + gradient_bytes + main_param_bytes + optimizer_bytes + buffer_bytes;
  }
};

// The rank of `layout` running `options` that holds the most. With LoRA (options.peft) only
// its frozen weights: the adapters and their state are counted apart (--dry_run's peft lines).
// Requires: options and layout that CheckGeometry accepted.
RankMemory EstimateRankMemory(const TrainOptions& options, const parallel::MeshLayout& layout);

// `bytes` for a reader: "12.5 MiB".
std::string Mib(int64_t bytes);

// A step's activations on the stage of `layout` whose ranks hold the most (1F1B: stage s keeps
// min(stages - s, micro-batches of a step) micro-batches' at once), each micro-batch
// local_batch_size rows of the data's sequence length (or packed_sequence_size).
struct RankActivations {
  int64_t stage = 0;
  int64_t micro_batches_in_flight = 1;
  models::ActivationMemory memory;
  int64_t peak_bytes() const { return memory.peak_bytes(micro_batches_in_flight); }
};
RankActivations EstimateRankActivations(const TrainOptions& options,
                                        const parallel::MeshLayout& layout);

// The memory one rank may take: its device's bytes and the host's (base::DeviceMemoryCapacity's;
// 0: unknown, not checked), the host shared evenly by the ranks that run on it (torchrun's
// LOCAL_WORLD_SIZE), and so is the device where it is the CPU.
struct MemoryCapacity {
  at::Device device = at::kCPU;
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int ranks_on_host = 1;
};

// Refuses a run whose model state cannot fit, before anything is built (a typo of 2^31 layers
// otherwise allocated until the machine ran out): EstimateRankMemory's total against the
// rank's share of its device, and the float32 weights the trainer first builds on the CPU
// against its share of the host. Activations are not counted, so a refused run would have
// failed for certain. Errors: kResourceExhausted naming what is needed, what is there, and what
// shrinks a rank's share.
[[nodiscard]] absl::Status CheckModelStateFits(const TrainOptions& options,
                                               const parallel::MeshLayout& layout,
                                               const MemoryCapacity& capacity);

// "precision: ...", "memory per rank: ..." and "activations per rank: ..." lines.
void PrintPrecisionAndMemory(const TrainOptions& options, const parallel::MeshLayout& layout,
                             std::ostream& out);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_MEMORY_H_
