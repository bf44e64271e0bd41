#include "sampling/samplers_cases.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sampling/megatron_sampler.h"

namespace keel::sampling {
namespace {

using base::Json;

absl::StatusOr<int64_t> ReadInt(const Json& inputs, const std::string& key) {
  int64_t value = 0;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value(key, Json()), "inputs." + key, value));
  return value;
}

Json BatchesOfPass(MegatronSampler& sampler, std::optional<int64_t> take) {
  Json batches = Json::array();
  if (take.has_value() && *take <= 0) return batches;  // Python never calls next()
  auto it = sampler.begin();
  for (int64_t taken = 1; it != sampler.end(); ++taken) {
    batches.push_back(*it);
    if (take.has_value() && taken == *take) break;  // abandoned: the next one is not taken
    ++it;
  }
  return batches;
}

absl::StatusOr<Json> RecordRandom(const Json& inputs, MegatronSampler& sampler) {
  if (inputs.contains("consumed_samples")) {
    KEEL_ASSIGN_OR_RETURN(const int64_t consumed, ReadInt(inputs, "consumed_samples"));
    MegatronSamplerState state = sampler.State();
    state.consumed_samples = consumed;
    KEEL_RETURN_IF_ERROR(sampler.LoadState(state));
  }
  const Json passes = inputs.value("passes", Json::array({Json{{"take", nullptr}}}));
  if (!passes.is_array()) return absl::InvalidArgumentError("inputs.passes must be an array");
  Json records = Json::array();
  for (size_t i = 0; i < passes.size(); ++i) {
    std::optional<int64_t> take;
    KEEL_RETURN_IF_ERROR(base::FromJson(passes[i].value("take", Json()),
                                        absl::StrCat("inputs.passes[", i, "].take"), take));
    Json record = {{"len_before", sampler.size()},
                   {"consumed_samples_before", sampler.consumed_samples()}};
    record["batches"] = BatchesOfPass(sampler, take);
    record["epoch"] = sampler.epoch();
    record["consumed_samples_after"] = sampler.consumed_samples();
    records.push_back(std::move(record));
  }
  return Json{{"data_parallel_rank", sampler.options().data_parallel_rank},
              {"sampler_class", "MegatronPretrainingRandomSampler"},
              {"len_after", sampler.size()},
              {"passes", std::move(records)}};
}

absl::StatusOr<Json> Record(const Json& inputs, MegatronSampler& sampler) {
  if (dynamic_cast<MegatronPretrainingRandomSampler*>(&sampler) != nullptr) {
    return RecordRandom(inputs, sampler);
  }
  Json record = {{"data_parallel_rank", sampler.options().data_parallel_rank},
                 {"sampler_class", "MegatronPretrainingSampler"},
                 {"len", sampler.size()}};
  record["batches"] = BatchesOfPass(sampler, std::nullopt);
  return record;
}

absl::StatusOr<std::unique_ptr<MegatronSampler>> Build(const Json& inputs, const std::string& kind,
                                                       int64_t rank) {
  if (kind == "create_megatron_sampler") {
    MegatronSamplerOptions options;
    KEEL_RETURN_IF_ERROR(base::ReadJsonFields(inputs, options, "inputs."));
    KEEL_ASSIGN_OR_RETURN(const int64_t dataset_len, ReadInt(inputs, "dataset_len"));
    KEEL_ASSIGN_OR_RETURN(const int64_t world_size, ReadInt(inputs, "world_size"));
    return CreateMegatronSampler(options, dataset_len, rank, world_size);
  }
  PretrainingSamplerOptions options;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(inputs, options, "inputs."));
  options.data_parallel_rank = rank;
  if (kind == "MegatronPretrainingSampler") {
    KEEL_ASSIGN_OR_RETURN(auto sampler, MegatronPretrainingSampler::Create(options));
    return std::unique_ptr<MegatronSampler>(std::move(sampler));
  }
  if (kind == "MegatronPretrainingRandomSampler") {
    KEEL_ASSIGN_OR_RETURN(auto sampler, MegatronPretrainingRandomSampler::Create(options));
    return std::unique_ptr<MegatronSampler>(std::move(sampler));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("inputs.kind \"", kind,
                   "\" is not one of MegatronPretrainingSampler, "
                   "MegatronPretrainingRandomSampler, create_megatron_sampler"));
}

}  // namespace

absl::StatusOr<Json> RunSamplersCase(const Json& inputs) {
  std::string kind;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("kind", Json()), "inputs.kind", kind));
  std::vector<int64_t> ranks;
  if (inputs.contains("record_ranks")) {
    KEEL_RETURN_IF_ERROR(base::FromJson(inputs["record_ranks"], "inputs.record_ranks", ranks));
  } else {
    const std::string size_key =
        kind == "create_megatron_sampler" ? "world_size" : "data_parallel_size";
    KEEL_ASSIGN_OR_RETURN(const int64_t size, ReadInt(inputs, size_key));
    // A non-positive size records rank 0, so that the sampler reports the error.
    for (int64_t rank = 0; rank < std::max<int64_t>(size, 1); ++rank) ranks.push_back(rank);
  }
  Json per_rank = Json::array();
  for (const int64_t rank : ranks) {
    KEEL_ASSIGN_OR_RETURN(std::unique_ptr<MegatronSampler> sampler, Build(inputs, kind, rank));
    KEEL_ASSIGN_OR_RETURN(Json record, Record(inputs, *sampler));
    per_rank.push_back(std::move(record));
  }
  return Json{{"per_rank", std::move(per_rank)}};
}

}  // namespace keel::sampling
