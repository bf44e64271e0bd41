#include "sampling/internal/gpt_index.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace keel::sampling::internal {
namespace {

// Megatron's count of a padded split's samples, ceil(float(n) / seq_length), in single
// precision as helpers.cpp computes it. It can exceed the exact count for n > 2^24, where
// Megatron then aborts; Keel takes the exact count there instead.
int64_t PaddedSampleCount(int64_t tokens, int64_t sequence_length) {
  const auto single = static_cast<int64_t>(
      std::ceil(static_cast<float>(tokens) / static_cast<float>(sequence_length)));
  const int64_t exact = (tokens + sequence_length - 1) / sequence_length;
  return std::min(single, exact);
}

template <typename T>
absl::Status FillSampleIndex(const IndexedDataset& dataset, const int32_t* document_index,
                             const GptIndexPlan& plan, const GptIndexParams& params, T* out) {
  const int64_t documents = plan.num_epochs * (plan.end - plan.begin);
  int64_t position = 0;  // in document_index
  int64_t offset = 0;    // tokens of that document already used
  out[0] = 0;
  out[1] = 0;
  for (int64_t sample = 1; sample <= plan.size; ++sample) {
    // Each sample takes sequence_length + extra tokens and hands the extra one to the next.
    int64_t remaining = params.sequence_length + params.extra;
    while (remaining != 0) {
      const int64_t length = dataset.sequence_length(document_index[position]) - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - params.extra;
        remaining = 0;
      } else if (position == documents - 1) {  // out of documents: a padded last sample
        offset = dataset.sequence_length(document_index[position]) - params.extra;
        if (offset < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the last sample of the split ends in an empty document (", document_index[position],
              ") and cannot be padded; set drop_last_partial_validation_sequence"));
        }
        break;
      } else {
        ++position;
        offset = 0;
      }
    }
    out[2 * sample] = static_cast<T>(position);
    out[2 * sample + 1] = static_cast<T>(offset);
  }
  return absl::OkStatus();
}

template <typename T>
void FillShuffleIndex(const GptIndexPlan& plan, NumpyRandomState& rng, T* out) {
  std::iota(out, out + plan.size, T{0});
  const int64_t first = plan.separate_final_epoch ? plan.num_samples_sans_final_epoch : plan.size;
  rng.Shuffle(out, first);
  if (first < plan.size) rng.Shuffle(out + first, plan.size - first);
}

}  // namespace

absl::StatusOr<GptIndexPlan> PlanGptIndex(const IndexedDataset& dataset, int64_t begin, int64_t end,
                                          std::optional<int64_t> num_samples,
                                          const GptIndexParams& params) {
  GptIndexPlan plan;
  plan.begin = begin;
  plan.end = end;
  for (int64_t i = begin; i < end; ++i) plan.tokens_per_epoch += dataset.sequence_length(i);
  const int64_t tokens = plan.tokens_per_epoch;
  if (tokens < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "documents [", begin, ", ", end, ") hold ", tokens,
        " tokens: a GPT dataset needs at least 2 (Megatron aborts or never returns here)"));
  }
  if (num_samples.has_value() && *num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples (", *num_samples, ") must be >= 0"));
  }
  const int64_t L = params.sequence_length;
  if (num_samples.has_value()) {
    const int64_t requested = *num_samples * L + params.extra;
    plan.num_epochs = std::max<int64_t>(1, (requested + tokens - 1) / tokens);
  }
  if (plan.num_epochs > 1) {
    plan.num_samples_sans_final_epoch = ((plan.num_epochs - 1) * tokens - params.extra) / L;
    const int64_t from_final = *num_samples - plan.num_samples_sans_final_epoch;
    const int64_t per_epoch = (tokens - params.extra) / L;
    plan.separate_final_epoch = from_final < static_cast<int64_t>(0.80 * per_epoch);
  }
  const int64_t all_tokens = plan.num_epochs * tokens - params.extra;
  plan.size = params.drop_last_partial_sequence ? all_tokens / L : PaddedSampleCount(all_tokens, L);
  const int64_t documents = plan.num_epochs * (end - begin);
  if (documents > std::numeric_limits<int32_t>::max()) plan.sample_dtype = IndexDtype::kInt64;
  if (plan.size >= int64_t{std::numeric_limits<uint32_t>::max()} - 1) {
    plan.shuffle_dtype = IndexDtype::kInt64;
  }
  return plan;
}

void BuildDocumentIndex(const GptIndexPlan& plan, NumpyRandomState& rng, int32_t* out) {
  const int64_t per_epoch = plan.end - plan.begin;
  for (int64_t epoch = 0; epoch < plan.num_epochs; ++epoch) {
    std::iota(out + epoch * per_epoch, out + (epoch + 1) * per_epoch,
              static_cast<int32_t>(plan.begin));
  }
  const int64_t together = plan.separate_final_epoch ? plan.num_epochs - 1 : plan.num_epochs;
  rng.Shuffle(out, together * per_epoch);
  if (together < plan.num_epochs) rng.Shuffle(out + together * per_epoch, per_epoch);
}

absl::Status BuildSampleIndex(const IndexedDataset& dataset, const int32_t* document_index,
                              const GptIndexPlan& plan, const GptIndexParams& params,
                              const IndexArray& out) {
  if (plan.sample_dtype == IndexDtype::kInt64) {
    return FillSampleIndex(dataset, document_index, plan, params, out.data<int64_t>());
  }
  return FillSampleIndex(dataset, document_index, plan, params, out.data<int32_t>());
}

void BuildShuffleIndex(const GptIndexPlan& plan, NumpyRandomState& rng, const IndexArray& out) {
  if (plan.shuffle_dtype == IndexDtype::kInt64) {
    FillShuffleIndex(plan, rng, out.data<int64_t>());
  } else {
    FillShuffleIndex(plan, rng, out.data<uint32_t>());
  }
}

}  // namespace keel::sampling::internal
