#include "sampling/megatron_gpt_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/internal/md5.h"
#include "sampling/internal/python_json.h"
#include "sampling/internal/tokens.h"
#include "sampling/numpy_random.h"

// The index cache. A GPT dataset's indices are four files in the cache directory, named by
// the MD5 of its description (Megatron's unique_description: class, dataset path,
// num_samples, split, seed, sequence length, split string and matrix, tokenizer): the
// description text and the document, sample and shuffle indices as .npy. Megatron tests
// that all four exist and loads the arrays memory-mapped; so does Keel, which also checks
// their shapes against the plan. A build writes each array to "<name>.<pid>.tmp" through a
// shared mapping, flushes it and renames it into place (base::RenameDurably), and writes the
// description last (base::WriteFileAtomically): a reader sees all four files only once all
// are complete, and a crash leaves at most temporary files.
namespace keel::sampling {
namespace {

using base::Json;
using internal::IndexArray;
using internal::IndexDtype;

std::string CachePath(const std::string& base, absl::string_view affix) {
  return absl::StrCat(base, "-", affix);
}

// The split matrix as Megatron's config holds it: split 0 starts at the integer 0.
Json SplitMatrixJson(const GptDatasetConfig& config) {
  if (!config.split.has_value()) return nullptr;
  absl::StatusOr<std::vector<double>> vector = ParseAndNormalizeSplit(*config.split);
  if (!vector.ok()) return nullptr;  // Requires: validated; never happens
  const SplitMatrix matrix = ConvertSplitVectorToSplitMatrix(*vector);
  Json json = Json::array();
  for (size_t i = 0; i < matrix.size(); ++i) {
    if (!matrix[i].has_value()) {
      json.push_back(nullptr);
    } else {
      json.push_back({i == 0 ? Json(0) : Json(matrix[i]->first), Json(matrix[i]->second)});
    }
  }
  return json;
}

Json UniqueIdentifiers(const std::string& dataset_path, std::optional<int64_t> num_samples,
                       Split split, const GptDatasetConfig& config) {
  return {{"class", "GPTDataset"},
          {"dataset_path", dataset_path},
          {"num_samples", base::ToJson(num_samples)},
          {"index_split", AbslUnparseFlag(split)},
          {"random_seed", config.random_seed},
          {"sequence_length", config.sequence_length},
          {"split", base::ToJson(config.split)},
          {"split_matrix", SplitMatrixJson(config)},
          {"tokenizer", config.tokenizer.unique_identifiers}};
}

// Creates the array at a temporary name; Publish moves it to `path`.
absl::StatusOr<IndexArray> CreateTemporary(const std::string& path, IndexDtype dtype,
                                           std::vector<int64_t> shape) {
  return IndexArray::CreateNpy(absl::StrCat(path, ".", ::getpid(), ".tmp"), dtype,
                               std::move(shape));
}

absl::Status Publish(const IndexArray& array, const std::string& path) {
  KEEL_RETURN_IF_ERROR(array.Sync());
  return base::RenameDurably(absl::StrCat(path, ".", ::getpid(), ".tmp"), path);
}

absl::Status CheckShape(const IndexArray& array, std::vector<int64_t> shape,
                        std::vector<IndexDtype> dtypes, const std::string& path) {
  if (array.shape() == shape &&
      std::find(dtypes.begin(), dtypes.end(), array.dtype()) != dtypes.end()) {
    return absl::OkStatus();
  }
  std::vector<std::string> dims;
  for (int64_t d : array.shape()) dims.push_back(absl::StrCat(d));
  return absl::DataLossError(absl::StrCat(
      path, " holds ", internal::NpyDescr(array.dtype()), " of shape (", absl::StrJoin(dims, ", "),
      "), not what this configuration needs (first dimension ", shape[0],
      "): it was written for another add_extra_token_to_sequence or "
      "drop_last_partial_validation_sequence (Megatron's cache name leaves them out), or is "
      "corrupt; delete it to rebuild"));
}

}  // namespace

std::string IndexCacheDirectory(const GptDatasetConfig& config, const std::string& dataset_path,
                                const std::string& class_name) {
  if (config.path_to_cache.has_value()) return *config.path_to_cache;
  return base::JoinPath(base::JoinPath(dataset_path, "cache"), class_name + "_indices");
}

absl::StatusOr<std::shared_ptr<const MegatronGptDataset>> MegatronGptDataset::Create(
    std::shared_ptr<const IndexedDataset> indexed_dataset, std::string dataset_path,
    std::pair<int64_t, int64_t> indexed_indices, std::optional<int64_t> num_samples,
    Split index_split, const GptDatasetConfig& config, IndexCacheMode mode) {
  std::shared_ptr<MegatronGptDataset> gpt(new MegatronGptDataset());
  gpt->dataset_ = std::move(indexed_dataset);
  gpt->dataset_path_ = std::move(dataset_path);
  gpt->num_samples_ = num_samples;
  gpt->index_split_ = index_split;
  gpt->sequence_length_ = config.sequence_length;
  gpt->extra_ = config.add_extra_token_to_sequence ? 1 : 0;
  const GptTokenizer& tokenizer = config.tokenizer;
  const bool ambiguous = tokenizer.pad.has_value() && tokenizer.pad == tokenizer.eod;
  if (tokenizer.pad.has_value() && (!ambiguous || config.allow_ambiguous_pad_tokens)) {
    gpt->pad_token_id_ = *tokenizer.pad;
  }
  if (*config.eod_mask_loss) gpt->eod_mask_token_ = tokenizer.eod;
  gpt->vocab_size_ = tokenizer.vocab_size;
  gpt->params_.sequence_length = config.sequence_length;
  gpt->params_.extra = gpt->extra_;
  gpt->params_.drop_last_partial_sequence =
      index_split != Split::kValid || config.drop_last_partial_validation_sequence;
  const TokenDtype dtype = gpt->dataset_->dtype();
  if (dtype == TokenDtype::kFloat32 || dtype == TokenDtype::kFloat64) {
    return absl::InvalidArgumentError(absl::StrCat(gpt->dataset_path_, ": the tokens are ",
                                                   AbslUnparseFlag(dtype), "; GPT needs integers"));
  }
  KEEL_ASSIGN_OR_RETURN(gpt->plan_,
                        internal::PlanGptIndex(*gpt->dataset_, indexed_indices.first,
                                               indexed_indices.second, num_samples, gpt->params_));
  gpt->unique_identifiers_ =
      UniqueIdentifiers(gpt->dataset_path_, num_samples, index_split, config);
  KEEL_RETURN_IF_ERROR(gpt->LoadOrBuild(
      IndexCacheDirectory(config, gpt->dataset_path_, "GPTDataset"), config, mode));
  return std::shared_ptr<const MegatronGptDataset>(std::move(gpt));
}

absl::Status MegatronGptDataset::LoadOrBuild(const std::string& cache_dir,
                                             const GptDatasetConfig& config, IndexCacheMode mode) {
  const std::string description = internal::PythonJsonDumps(unique_identifiers_);
  const std::string base = base::JoinPath(
      cache_dir,
      absl::StrCat(internal::Md5Hex(description), "-GPTDataset-", AbslUnparseFlag(index_split_)));
  bool hit = true;
  for (const char* affix :
       {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"}) {
    hit = hit && base::PathExists(CachePath(base, affix));
  }
  if (mode == IndexCacheMode::kPlanOnly) {
    planned_only_ = true;
    return absl::OkStatus();
  }
  if (hit) return Load(base);
  if (mode == IndexCacheMode::kLoadOnly) {
    return absl::NotFoundError(absl::StrCat("no index cache ", base, "-*: the rank that builds ",
                                            "it (rank 0) has not written it"));
  }
  absl::Status built = Build(cache_dir, base, description, config.random_seed);
  return base::Annotate(built, absl::StrCat("building the ", AbslUnparseFlag(index_split_),
                                            " indices of ", dataset_path_, " in ", cache_dir));
}

absl::Status MegatronGptDataset::Build(const std::string& cache_dir, const std::string& base,
                                       const std::string& description, int64_t random_seed) {
  KEEL_RETURN_IF_ERROR(base::MakeDirectories(cache_dir));
  KEEL_ASSIGN_OR_RETURN(NumpyRandomState rng, NumpyRandomState::Create(random_seed));
  const std::string document_path = CachePath(base, "document_index.npy");
  const std::string sample_path = CachePath(base, "sample_index.npy");
  const std::string shuffle_path = CachePath(base, "shuffle_index.npy");
  const int64_t documents = plan_.num_epochs * (plan_.end - plan_.begin);
  KEEL_ASSIGN_OR_RETURN(document_index_,
                        CreateTemporary(document_path, IndexDtype::kInt32, {documents}));
  internal::BuildDocumentIndex(plan_, rng, document_index_.data<int32_t>());
  KEEL_ASSIGN_OR_RETURN(sample_index_,
                        CreateTemporary(sample_path, plan_.sample_dtype, {plan_.size + 1, 2}));
  KEEL_RETURN_IF_ERROR(internal::BuildSampleIndex(*dataset_, document_index_.data<int32_t>(), plan_,
                                                  params_, sample_index_));
  KEEL_ASSIGN_OR_RETURN(shuffle_index_,
                        CreateTemporary(shuffle_path, plan_.shuffle_dtype, {plan_.size}));
  internal::BuildShuffleIndex(plan_, rng, shuffle_index_);
  KEEL_RETURN_IF_ERROR(Publish(document_index_, document_path));
  KEEL_RETURN_IF_ERROR(Publish(sample_index_, sample_path));
  KEEL_RETURN_IF_ERROR(Publish(shuffle_index_, shuffle_path));
  return base::WriteFileAtomically(CachePath(base, "description.txt"), description);
}

absl::Status MegatronGptDataset::Load(const std::string& base) {
  const std::string document_path = CachePath(base, "document_index.npy");
  const std::string sample_path = CachePath(base, "sample_index.npy");
  const std::string shuffle_path = CachePath(base, "shuffle_index.npy");
  KEEL_ASSIGN_OR_RETURN(document_index_, IndexArray::OpenNpy(document_path));
  KEEL_RETURN_IF_ERROR(CheckShape(document_index_, {plan_.num_epochs * (plan_.end - plan_.begin)},
                                  {IndexDtype::kInt32}, document_path));
  KEEL_ASSIGN_OR_RETURN(sample_index_, IndexArray::OpenNpy(sample_path));
  KEEL_RETURN_IF_ERROR(CheckShape(sample_index_, {plan_.size + 1, 2},
                                  {IndexDtype::kInt32, IndexDtype::kInt64}, sample_path));
  KEEL_ASSIGN_OR_RETURN(shuffle_index_, IndexArray::OpenNpy(shuffle_path));
  return CheckShape(shuffle_index_, {plan_.size}, {IndexDtype::kUint32, IndexDtype::kInt64},
                    shuffle_path);
}

absl::Status MegatronGptDataset::CopyTokens(int64_t sequence, int64_t offset, int64_t length,
                                            int64_t* out) const {
  if (sequence < plan_.begin || sequence >= plan_.end || offset < 0 || length < 0 ||
      offset + length > dataset_->sequence_length(sequence)) {
    return absl::DataLossError(absl::StrCat(
        dataset_path_, ": the index cache asks for tokens [", offset, ", ", offset + length,
        ") of document ", sequence, ", outside the split [", plan_.begin, ", ", plan_.end,
        ") or the document; delete the cache to rebuild it"));
  }
  const uint8_t* bin = dataset_->bin_bytes().data() + dataset_->sequence_pointer(sequence);
  const int64_t item = TokenDtypeSize(dataset_->dtype());
  internal::WidenTokens(dataset_->dtype(), bin + offset * item, length, out);
  if (!vocab_size_.has_value()) return absl::OkStatus();
  for (int64_t i = 0; i < length; ++i) {
    if (out[i] < 0 || out[i] >= *vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(dataset_path_, ": token ", out[i], " (document ", sequence, ", position ",
                       offset + i, ") is outside the vocabulary [0, ", *vocab_size_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status MegatronGptDataset::Window(int64_t idx, absl::Span<int64_t> out) const {
  if (planned_only_) {
    return absl::FailedPreconditionError(
        absl::StrCat(dataset_path_, ": a planned dataset has no samples to read"));
  }
  if (idx < 0 || idx >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sample ", idx, " is outside [0, ", size(), ") of ", dataset_path_));
  }
  const int64_t shuffled = shuffle_index_.Get(idx);
  if (shuffled < 0 || shuffled >= size()) {
    return absl::DataLossError(absl::StrCat(dataset_path_, ": the cached shuffle index maps ", idx,
                                            " to ", shuffled, "; delete the cache"));
  }
  const int64_t begin = sample_index(shuffled, 0), begin_offset = sample_index(shuffled, 1);
  const int64_t end = sample_index(shuffled + 1, 0), end_offset = sample_index(shuffled + 1, 1);
  if (begin < 0 || end < begin || end >= document_index_size()) {
    return absl::DataLossError(absl::StrCat(dataset_path_, ": the cached sample index row ",
                                            shuffled, " is out of range; delete the cache"));
  }
  int64_t filled = 0;
  for (int64_t i = begin; i <= end; ++i) {
    const int64_t sequence = document_index(i);
    const int64_t offset = i == begin ? begin_offset : 0;
    const int64_t stop = i < end ? (sequence >= 0 && sequence < dataset_->size()
                                        ? dataset_->sequence_length(sequence)
                                        : 0)
                                 : end_offset + extra_;
    const int64_t length = std::min<int64_t>(stop - offset, window_size() - filled);
    KEEL_RETURN_IF_ERROR(CopyTokens(sequence, offset, length, out.data() + filled));
    filled += length;
  }
  std::fill(out.begin() + filled, out.end(), pad_token_id_);
  return absl::OkStatus();
}

absl::Status MegatronGptDataset::Sample(int64_t idx, absl::Span<int64_t> tokens,
                                        absl::Span<int64_t> labels,
                                        absl::Span<float> loss_mask) const {
  std::vector<int64_t> window(window_size());
  KEEL_RETURN_IF_ERROR(Window(idx, absl::MakeSpan(window)));
  const int64_t L = sequence_length_;
  for (int64_t i = 0; i < L; ++i) {
    tokens[i] = window[i];
    labels[i] = i + 1 < window_size() ? window[i + 1] : pad_token_id_;
    loss_mask[i] = eod_mask_token_.has_value() && tokens[i] == *eod_mask_token_ ? 0.0f : 1.0f;
    if (labels[i] == pad_token_id_) loss_mask[i] = 0.0f;
    if (tokens[i] == pad_token_id_) tokens[i] = 0;
    if (labels[i] == pad_token_id_) labels[i] = 0;
  }
  return absl::OkStatus();
}

}  // namespace keel::sampling
