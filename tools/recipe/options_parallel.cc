// The layout's geometry in the trainer's options: the model split over tensor, pipeline and
// expert parallelism, sequence parallelism, and the batch over the data-parallel ranks.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "tools/recipe/internal/option_checks.h"
#include "tools/recipe/options.h"

namespace keel::tools::recipe {
namespace {

// The first sizes in [1, limit] (at most 8, none past 2^20) for which `fits` holds, as
// "1, 2, 4" ("none" when there are none).
template <typename Fits>
std::string Working(int64_t limit, Fits fits) {
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= std::min<int64_t>(limit, 1 << 20) && sizes.size() < 8; ++n) {
    if (fits(n)) sizes.push_back(n);
  }
  return sizes.empty() ? "none" : absl::StrJoin(sizes, ", ");
}

// The pipeline stages split the layers evenly, each holding at least one.
absl::Status CheckPipelineParallelModel(const TrainOptions& options) {
  const int64_t pp = options.distributed.parallel.pipeline_model_parallel_size;
  const int64_t layers = options.model.num_layers;
  KEEL_RETURN_IF_ERROR(
      Require(pp > 0, "distributed.pipeline_model_parallel_size", pp, "must be > 0"));
  if (layers % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.pipeline_model_parallel_size (", pp, ") must divide model.num_layers (",
        layers, "): each stage holds an equal number of layers, at least one; sizes that do: ",
        Working(layers, [layers](int64_t n) { return layers % n == 0; })));
  }
  return absl::OkStatus();
}

// Mixture of experts: experts split evenly over ep, k of them per token, each expert split over
// expert tp (by default tp, as the MLPs are, which CheckModelParallelModel checks). Expert tp
// divides tp: an expert's ranks hold the same tokens, tp / expert tp copies of each reaching
// the experts (ScaleStep divides their gradients by that).
absl::Status CheckMixtureOfExperts(const TrainOptions& options) {
  const models::ModelOptions& m = options.model;
  const parallel::ModelParallelOptions& p = options.distributed.parallel;
  const int64_t ep = p.expert_model_parallel_size;
  const int64_t tp = p.tensor_model_parallel_size;
  const int64_t etp = p.expert_tensor_parallel_size.value_or(tp);
  KEEL_RETURN_IF_ERROR(
      Require(ep > 0, "distributed.expert_model_parallel_size", ep, "must be > 0"));
  if (m.num_moe_experts == 0) {
    KEEL_RETURN_IF_ERROR(Require(etp == tp, "distributed.expert_tensor_parallel_size", etp,
                                 "needs model.num_moe_experts > 0 (experts to split); allowed: "
                                 "unset"));
    return Require(ep == 1, "distributed.expert_model_parallel_size", ep,
                   "needs model.num_moe_experts > 0 (experts to split); allowed: 1");
  }
  if (tp > 0 && (etp <= 0 || tp % etp != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.expert_tensor_parallel_size (", etp,
        ") must divide distributed.tensor_model_parallel_size (", tp,
        "): an expert's ranks hold the same tokens, those of one tensor-parallel group; sizes "
        "that do: ",
        Working(tp, [tp](int64_t n) { return tp % n == 0; })));
  }
  KEEL_RETURN_IF_ERROR(
      Require(m.moe_layer_freq > 0, "model.moe_layer_freq", m.moe_layer_freq, "must be > 0"));
  KEEL_RETURN_IF_ERROR(Require(m.moe_aux_loss_coeff >= 0 && std::isfinite(m.moe_aux_loss_coeff),
                               "model.moe_aux_loss_coeff", m.moe_aux_loss_coeff,
                               "must be a finite number >= 0"));
  if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_moe_experts) {
    return absl::InvalidArgumentError(absl::StrCat("model.moe_router_topk (", m.moe_router_topk,
                                                   ") must be in [1, model.num_moe_experts (",
                                                   m.num_moe_experts, ")]"));
  }
  if (m.num_moe_experts % ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed.expert_model_parallel_size (", ep, ") must divide model.num_moe_experts (",
        m.num_moe_experts, "): each expert-parallel rank holds an equal share; sizes that do: ",
        Working(m.num_moe_experts, [&](int64_t n) { return m.num_moe_experts % n == 0; })));
  }
  return absl::OkStatus();
}

}  // namespace

// The tensor-parallel size splits the attention heads and the MLP evenly (the vocabulary is
// padded to fit); the pipeline size the layers.
absl::Status CheckModelParallelModel(const TrainOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckPipelineParallelModel(options));
  KEEL_RETURN_IF_ERROR(CheckMixtureOfExperts(options));
  const int64_t tp = options.distributed.parallel.tensor_model_parallel_size;
  const models::ModelOptions& m = options.model;
  KEEL_RETURN_IF_ERROR(
      Require(tp > 0, "distributed.tensor_model_parallel_size", tp, "must be > 0"));
  std::vector<std::pair<const char*, int64_t>> split = {
      {"model.num_attention_heads", m.num_attention_heads},
      {"model.ffn_hidden_size", m.ffn_hidden_size}};
  // Llama-style: each rank holds its key-value heads with the query heads that read them.
  if (m.family != models::ModelFamily::kGpt) {
    split.emplace_back("model.num_query_groups", models::KvHeads(m));
  }
  for (const auto& [field, value] : split) {
    if (value % tp == 0) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.tensor_model_parallel_size (", tp, ") must divide ", field, " (",
                     value, "): each tensor-parallel rank holds an equal share; sizes that do: ",
                     Working(value, [value](int64_t n) { return value % n == 0; })));
  }
  return absl::OkStatus();
}

// Sequence parallelism splits each row's sequence over the tensor-parallel ranks between their
// layers.
absl::Status CheckSequenceParallel(const TrainOptions& options) {
  if (!options.distributed.sequence_parallel) return absl::OkStatus();
  const int64_t tp = options.distributed.parallel.tensor_model_parallel_size;
  if (tp == 1) {
    return absl::InvalidArgumentError(
        "distributed.sequence_parallel (true) splits the sequence over the tensor-parallel ranks, "
        "and distributed.tensor_model_parallel_size is 1; allowed: sequence_parallel false, or "
        "tensor_model_parallel_size > 1");
  }
  const int64_t packed = options.packed_sequence.packed_sequence_size;
  const auto [field, length] =
      packed > 0 ? std::pair{"packed_sequence.packed_sequence_size", packed}
                 : std::pair{"data.sequence_length", options.data.dataset.sequence_length};
  if (length % tp == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " (", length, ") must be divisible by distributed.tensor_model_parallel_size (", tp,
      ") with distributed.sequence_parallel: each tensor-parallel rank holds an equal share of "
      "every sequence; allowed: a multiple of ",
      tp, ", or sequence_parallel false"));
}

absl::StatusOr<parallel::MeshLayout> CheckGeometry(const TrainOptions& options, int world_size) {
  absl::StatusOr<parallel::MeshLayout> layout =
      parallel::MeshLayout::Create(options.distributed.parallel, world_size);
  KEEL_RETURN_IF_ERROR(base::Annotate(layout.status(), "distributed"));
  const int dp = layout->data_parallel_size();
  const int64_t global = options.step_scheduler.global_batch_size;
  const int64_t local = options.local_batch_size;
  if (global > 0 && global % (local * dp) == 0) {
    const int64_t pp = options.distributed.parallel.pipeline_model_parallel_size;
    const int64_t micro_batches = global / (local * dp);
    if (micro_batches >= pp) return layout;
    return absl::InvalidArgumentError(absl::StrCat(
        "the 1F1B schedule of distributed.pipeline_model_parallel_size ", pp, " needs at least ",
        pp, " micro-batches per step, got step_scheduler.global_batch_size (", global,
        ") / (local_batch_size (", local, ") x data-parallel size (", dp, ")) = ", micro_batches,
        "; global_batch_size values that work: multiples of ", local * dp, " from ",
        local * dp * pp));
  }
  const std::string ranks = dp == world_size ? absl::StrCat("the world size (", world_size, ")")
                                             : absl::StrCat("the data-parallel size (", dp, " of ",
                                                            world_size, " ranks)");
  return absl::InvalidArgumentError(absl::StrCat(
      "step_scheduler.global_batch_size (", global,
      ") must be a positive multiple of step_scheduler.local_batch_size (", local, ") x ", ranks,
      " = ", local * dp, "; ", dp == world_size ? "world" : "data-parallel",
      " sizes that work with this local_batch_size: ",
      Working(global, [&](int64_t w) { return global % local == 0 && global / local % w == 0; }),
      "; local_batch_size values that work on ", dp, " data-parallel rank(s): ",
      Working(global, [&](int64_t l) { return global % dp == 0 && global / dp % l == 0; })));
}

}  // namespace keel::tools::recipe
