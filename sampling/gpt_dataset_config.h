// The configuration of Megatron-Core's GPT data pipeline: GPTDatasetConfig with the
// BlendedMegatronDatasetConfig it extends (megatron/core/datasets/gpt_dataset.py,
// blended_megatron_dataset_config.py), the split string and matrix, and the blend list of
// --data-path (megatron/core/datasets/utils.py get_blend_from_list, normalize).
//
//   keel::sampling::GptDatasetConfig config;
//   config.random_seed = 1234;
//   config.sequence_length = 4096;
//   config.blend = keel::sampling::Blend{{"/data/a", "/data/b"}, {{0.3, 0.7}}};
//   config.split = "969,30,1";
//   config.reset_position_ids = config.reset_attention_mask = config.eod_mask_loss = false;
//   KEEL_ASSIGN_OR_RETURN(auto matrix, keel::sampling::ValidateGptDatasetConfig(config));
#ifndef KEEL_SAMPLING_GPT_DATASET_CONFIG_H_
#define KEEL_SAMPLING_GPT_DATASET_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/fields.h"
#include "base/json.h"

namespace keel::sampling {

// Megatron's Split enum: the spellings "train", "valid", "test" (Split.name).
enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
inline constexpr Split kSplits[] = {Split::kTrain, Split::kValid, Split::kTest};
bool AbslParseFlag(absl::string_view text, Split* out, std::string* error);
std::string AbslUnparseFlag(Split split);

// Dataset prefixes with optional weights (Tuple[List[str], Optional[List[float]]]); in JSON
// [[prefix, ...], [weight, ...] or null].
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};
[[nodiscard]] absl::Status FromJson(const base::Json& json, absl::string_view what, Blend& out);
base::Json ToJson(const Blend& blend);

// What the datasets read of config.tokenizer; in JSON {"vocab_size", "eod", "pad",
// "unique_identifiers"}.
struct GptTokenizer {
  // Keel checks token ids against it (Megatron does not). Default: nullopt (unchecked).
  std::optional<int64_t> vocab_size;
  // tokenizer.eod; a pad equal to it is no pad (MegatronDataset). Default: nullopt.
  std::optional<int64_t> eod;
  // tokenizer.pad; nullopt: no pad token, the pad id is -1. Default: nullopt.
  std::optional<int64_t> pad;
  // tokenizer.unique_identifiers, the "tokenizer" of the index cache descriptions.
  // Default: {}.
  base::Json unique_identifiers = base::Json::object();
};
[[nodiscard]] absl::Status FromJson(const base::Json& json, absl::string_view what,
                                    GptTokenizer& out);
base::Json ToJson(const GptTokenizer& tokenizer);

// Mirrors GPTDatasetConfig (with BlendedMegatronDatasetConfig's fields first): same names,
// order and defaults. Left out: mock data (Keel needs blend or blend_per_split), object
// storage, fast_cache_load, defer_npy_index_mmap, sequences_per_dataset,
// num_dataset_builder_threads, attention masks, context parallelism and the mock and varlen
// SFT datasets.
struct GptDatasetConfig {
  // Seeds numpy's RandomState for every dataset's shuffles; Python has no default.
  int64_t random_seed = 0;
  // Tokens per sample (labels shifted by one); Python has no default, Megatron needs > 1.
  int64_t sequence_length = 0;
  // One distribution for all splits. Default: nullopt.
  std::optional<Blend> blend;
  // One blend (or none) per split, train, valid, test; not with blend. Default: nullopt.
  std::optional<std::vector<std::optional<Blend>>> blend_per_split;
  // The valid split of a blend_per_split as separate datasets. Default: nullopt.
  std::optional<bool> multiple_validation_sets;
  // With multiple_validation_sets: each valid dataset holds one epoch. Default: nullopt.
  std::optional<bool> full_validation;
  // Weights of train, valid and test, e.g. "969,30,1"; with blend only. Default: nullopt.
  std::optional<std::string> split;
  // Directory of the index caches; nullopt: "<prefix>/cache/GPTDataset_indices" for each
  // dataset, and blends are not cached. Default: nullopt.
  std::optional<std::string> path_to_cache;
  // Keel always maps the .bin; false reads the same tokens. Default: true.
  bool mmap_bin_files = true;
  // Each blended dataset's GPT datasets are built this much larger. Default: 0.005.
  double mid_level_dataset_surplus = 0.005;
  // Keep a pad id that equals tokenizer.eod. Default: false.
  bool allow_ambiguous_pad_tokens = false;
  // The tokenizer's ids (config.tokenizer).
  GptTokenizer tokenizer;
  // Must be set (Megatron asserts); Keel's samples carry no position ids or attention mask,
  // so these two must be false. Default: nullopt.
  std::optional<bool> reset_position_ids;
  std::optional<bool> reset_attention_mask;
  // Must be set; true masks the loss at tokenizer.eod. Default: nullopt.
  std::optional<bool> eod_mask_loss;
  // The valid split's last, partial sample is dropped (else padded). Default: true.
  bool drop_last_partial_validation_sequence = true;
  // Samples carry sequence_length + 1 tokens (tokens and labels both sequence_length long).
  // Default: true.
  bool add_extra_token_to_sequence = true;
};

template <typename O, typename V, base::IsFieldsOf<O, GptDatasetConfig> = 0>
void VisitFields(O& o, V&& v) {
  v("random_seed", o.random_seed);
  v("sequence_length", o.sequence_length);
  v("blend", o.blend);
  v("blend_per_split", o.blend_per_split);
  v("multiple_validation_sets", o.multiple_validation_sets);
  v("full_validation", o.full_validation);
  v("split", o.split);
  v("path_to_cache", o.path_to_cache);
  v("mmap_bin_files", o.mmap_bin_files);
  v("mid_level_dataset_surplus", o.mid_level_dataset_surplus);
  v("allow_ambiguous_pad_tokens", o.allow_ambiguous_pad_tokens);
  v("tokenizer", o.tokenizer);
  v("reset_position_ids", o.reset_position_ids);
  v("reset_attention_mask", o.reset_attention_mask);
  v("eod_mask_loss", o.eod_mask_loss);
  v("drop_last_partial_validation_sequence", o.drop_last_partial_validation_sequence);
  v("add_extra_token_to_sequence", o.add_extra_token_to_sequence);
}

// Each split's [begin, end) fraction of the documents, or nullopt where it gets none
// (config.split_matrix). Split train's begin is Python's integer 0.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;

// numpy's normalize: the weights over their sum, summed as numpy.sum does (pairwise).
std::vector<double> Normalize(absl::Span<const double> weights);

// parse_and_normalize_split: up to three non-negative decimal numbers, any characters but
// letters and signs separating them as upstream's ("969,30,1", "70 20 10", "8/1/1",
// "0.9, 0.1"), missing ones 0, normalized. Errors: kInvalidArgument naming the string for a
// letter or a sign (upstream reads "-1,2,1" and "1e2,1" as 1,2,1), more than three numbers,
// or numbers that sum to 0.
[[nodiscard]] absl::StatusOr<std::vector<double>> ParseAndNormalizeSplit(absl::string_view split);

// convert_split_vector_to_split_matrix of one vector: bookends summed in order from 0.
SplitMatrix ConvertSplitVectorToSplitMatrix(absl::Span<const double> vector);

// get_blend_from_list for --data-path / NeMo's paths: "p1 p2 ..." (no weights) or
// "w1 p1 w2 p2 ...", prefixes stripped. Errors: kInvalidArgument for an empty list, or a
// list with a number where a weight goes that is not all weights and prefixes (upstream's
// assert lets some through; NeMo's is_zipped_list refuses them).
[[nodiscard]] absl::StatusOr<Blend> GetBlendFromList(const std::vector<std::string>& items);

// __post_init__ of both configs, plus what Megatron checks only while building (weights > 0,
// sequence_length > 1, the seed numpy accepts) and Keel's limits: the split matrix
// (nullopt with blend_per_split). Errors: kInvalidArgument naming the field and value:
// blend with blend_per_split, split with blend_per_split, a blend_per_split not of 3 blends,
// prefixes and weights not equal in number, no blend (Keel has no mock data), a bad split,
// an unset reset_position_ids, reset_attention_mask or eod_mask_loss, true
// reset_position_ids or reset_attention_mask, a non-positive or non-finite weight, a blend
// of no or 32767 prefixes or more, a negative mid_level_dataset_surplus,
// sequence_length < 2, a random_seed outside [0, 2^32 - 1].
[[nodiscard]] absl::StatusOr<std::optional<SplitMatrix>> ValidateGptDatasetConfig(
    const GptDatasetConfig& config);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_GPT_DATASET_CONFIG_H_
