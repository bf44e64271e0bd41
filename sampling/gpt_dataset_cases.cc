#include "sampling/gpt_dataset_cases.h"

#include <stdlib.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "sampling/gpt_dataset_builder.h"
#include "sampling/indexed_dataset_writer.h"

namespace keel::sampling {
namespace {

using base::Json;
using GptPtr = std::shared_ptr<const MegatronGptDataset>;

// A temporary directory under $TEST_TMPDIR, $TMPDIR or /tmp, removed with its contents.
class TempDirectory {
 public:
  static absl::StatusOr<std::unique_ptr<TempDirectory>> Create() {
    std::string root = "/tmp";
    for (const char* name : {"TEST_TMPDIR", "TMPDIR"}) {
      const char* value = getenv(name);
      if (value != nullptr && *value != '\0') {
        root = value;
        break;
      }
    }
    std::string path = base::JoinPath(root, "keel-gpt-case.XXXXXX");
    if (mkdtemp(path.data()) == nullptr) return base::ErrnoError("mkdtemp", path);
    return std::unique_ptr<TempDirectory>(new TempDirectory(std::move(path)));
  }
  ~TempDirectory() { base::RemoveTree(path_).IgnoreError(); }
  const std::string& path() const { return path_; }

 private:
  explicit TempDirectory(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// One dataset of the README's recipe: a sequence per document, token j of document d
// (token_seed * 1000003 + d * 7919 + j * 101) % vocab_size, the last one eod if set.
absl::Status WriteDataset(const Json& spec, const std::string& name, const std::string& prefix) {
  std::vector<int64_t> lengths;
  int64_t seed = 0, vocab = 0;
  std::optional<int64_t> eod;
  TokenDtype dtype = TokenDtype::kUint16;
  const std::string what = "inputs.datasets." + name;
  KEEL_RETURN_IF_ERROR(
      base::FromJson(spec.value("document_lengths", Json()), what + ".document_lengths", lengths));
  KEEL_RETURN_IF_ERROR(
      base::FromJson(spec.value("token_seed", Json()), what + ".token_seed", seed));
  KEEL_RETURN_IF_ERROR(
      base::FromJson(spec.value("vocab_size", Json()), what + ".vocab_size", vocab));
  KEEL_RETURN_IF_ERROR(base::FromJson(spec.value("eod", Json()), what + ".eod", eod));
  KEEL_RETURN_IF_ERROR(base::FromJson(spec.value("dtype", Json()), what + ".dtype", dtype));
  if (vocab <= 0) return absl::InvalidArgumentError(what + ".vocab_size must be > 0");
  KEEL_ASSIGN_OR_RETURN(IndexedDatasetWriter writer, IndexedDatasetWriter::Create(prefix, dtype));
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int64_t> tokens(lengths[d]);
    for (int64_t j = 0; j < lengths[d]; ++j) {
      tokens[j] = (seed * 1000003 + static_cast<int64_t>(d) * 7919 + j * 101) % vocab;
    }
    if (eod.has_value() && !tokens.empty()) tokens.back() = *eod;
    KEEL_RETURN_IF_ERROR(writer.AddDocument(tokens, {lengths[d]}));
  }
  return writer.Finalize();
}

// inputs.config with dataset names replaced by their prefixes, and inputs.tokenizer.
absl::StatusOr<GptDatasetConfig> ReadConfig(const Json& inputs, const std::string& dir) {
  Json config = inputs.value("config", Json::object());
  const auto rename = [&](Json& blend) {
    if (!blend.is_array() || blend.empty() || !blend[0].is_array()) return;
    for (Json& name : blend[0]) {
      if (name.is_string()) name = base::JoinPath(dir, name.get<std::string>());
    }
  };
  if (config.contains("blend")) rename(config["blend"]);
  if (config.contains("blend_per_split") && config["blend_per_split"].is_array()) {
    for (Json& blend : config["blend_per_split"]) rename(blend);
  }
  if (!inputs.contains("tokenizer") || inputs["tokenizer"].is_null()) {
    return absl::InvalidArgumentError(
        "inputs.tokenizer is missing: Megatron's GPTDatasetConfig requires one (its "
        "__post_init__ asserts tokenizer is not None)");
  }
  config["tokenizer"] = inputs["tokenizer"];
  config["tokenizer"]["unique_identifiers"] = {{"class", "GoldenCaseTokenizer"}};
  config["path_to_cache"] = base::JoinPath(dir, "cache");
  GptDatasetConfig out;
  KEEL_RETURN_IF_ERROR(base::ReadJsonFields(config, out, "inputs.config."));
  return out;
}

Json Samples(const GptSplitView& view) {
  Json samples = Json::array();
  for (int64_t idx = 0; idx < view.size(); ++idx) {
    const GptSampleRef ref = *view.Locate(idx);
    const MegatronGptDataset& dataset = *view.datasets()[ref.dataset];
    const int64_t L = dataset.sequence_length();
    std::vector<int64_t> tokens(L), labels(L);
    std::vector<float> mask(L);
    Json sample = {{"idx", idx}};
    if (view.blend() != nullptr) sample["dataset_id"] = ref.dataset;
    absl::Status status = dataset.Sample(ref.dataset_sample, absl::MakeSpan(tokens),
                                         absl::MakeSpan(labels), absl::MakeSpan(mask));
    if (!status.ok()) {
      sample["error"] = std::string(status.message());
    } else {
      sample["tokens"] = tokens;
      sample["labels"] = labels;
      Json loss_mask = Json::array();
      for (float m : mask) loss_mask.push_back(static_cast<int64_t>(m));
      sample["loss_mask"] = loss_mask;
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

Json GptRecord(const MegatronGptDataset& gpt, const std::map<std::string, std::string>& names) {
  Json document_index = Json::array(), sample_index = Json::array(), shuffle = Json::array();
  for (int64_t i = 0; i < gpt.document_index_size(); ++i) {
    document_index.push_back(gpt.document_index(i));
  }
  for (int64_t row = 0; row <= gpt.size(); ++row) {
    sample_index.push_back({gpt.sample_index(row, 0), gpt.sample_index(row, 1)});
  }
  for (int64_t i = 0; i < gpt.size(); ++i) shuffle.push_back(gpt.shuffle_index(i));
  auto name = names.find(gpt.dataset_path());
  return {{"class", "GPTDataset"},
          {"dataset", name != names.end() ? name->second : gpt.dataset_path()},
          {"index_split", AbslUnparseFlag(gpt.index_split())},
          {"num_samples", base::ToJson(gpt.num_samples())},
          {"indexed_indices", {gpt.indexed_indices().first, gpt.indexed_indices().second}},
          {"len", gpt.size()},
          {"document_index", std::move(document_index)},
          {"sample_index", std::move(sample_index)},
          {"shuffle_index", std::move(shuffle)}};
}

Json BlendRecord(const BlendedDataset& blend, const std::map<std::string, std::string>& names) {
  Json record = {{"class", "BlendedDataset"},
                 {"index_split", AbslUnparseFlag(blend.split())},
                 {"weights", blend.weights()},
                 {"size", base::ToJson(blend.requested_size())},
                 {"len", blend.size()}};
  Json dataset_index = Json::array(), dataset_sample_index = Json::array();
  for (int64_t i = 0; i < blend.size(); ++i) {
    dataset_index.push_back(blend.dataset_index(i));
    dataset_sample_index.push_back(blend.dataset_sample_index(i));
  }
  record["dataset_index"] = std::move(dataset_index);
  record["dataset_sample_index"] = std::move(dataset_sample_index);
  record["datasets"] = Json::array();
  for (const GptPtr& dataset : blend.datasets()) {
    record["datasets"].push_back(GptRecord(*dataset, names));
  }
  return record;
}

Json SplitRecord(const std::optional<TopLevelDataset>& split,
                 const std::map<std::string, std::string>& names) {
  if (!split.has_value()) return nullptr;
  if (const auto* list = std::get_if<std::vector<GptPtr>>(&*split)) {
    Json items = Json::array();
    for (const GptPtr& gpt : *list) {
      Json record = GptRecord(*gpt, names);
      record["samples"] = Samples(*GptSplitView::Of(TopLevelDataset(gpt)));
      items.push_back(std::move(record));
    }
    return {{"class", "list"}, {"items", std::move(items)}};
  }
  const GptSplitView view = *GptSplitView::Of(split);
  Json record = view.blend() != nullptr ? BlendRecord(*view.blend(), names)
                                        : GptRecord(*view.datasets()[0], names);
  record["samples"] = Samples(view);
  return record;
}

}  // namespace

absl::StatusOr<Json> RunGptDatasetCase(const Json& inputs) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<TempDirectory> dir, TempDirectory::Create());
  const Json datasets = inputs.value("datasets", Json::object());
  if (!datasets.is_object()) return absl::InvalidArgumentError("inputs.datasets must be an object");
  std::map<std::string, std::string> names;  // prefix -> name
  for (const auto& [name, spec] : datasets.items()) {
    const std::string prefix = base::JoinPath(dir->path(), name);
    KEEL_RETURN_IF_ERROR(WriteDataset(spec, name, prefix));
    names[prefix] = name;
  }
  KEEL_ASSIGN_OR_RETURN(GptDatasetConfig config, ReadConfig(inputs, dir->path()));
  std::vector<std::optional<int64_t>> size_list;
  KEEL_RETURN_IF_ERROR(base::FromJson(inputs.value("sizes", Json()), "inputs.sizes", size_list));
  if (size_list.size() != 3) return absl::InvalidArgumentError("inputs.sizes must hold 3 sizes");
  const SplitSizes sizes = {size_list[0], size_list[1], size_list[2]};
  KEEL_ASSIGN_OR_RETURN(GptDatasetSplits splits, BuildGptDatasets(config, sizes));
  Json records = Json::array();
  for (const auto& split : splits) records.push_back(SplitRecord(split, names));
  return Json{{"splits", std::move(records)}};
}

Json SelectGoldenSamples(const Json& expected, Json actual) {
  if (expected.is_object() && actual.is_object()) {
    for (auto& [key, value] : actual.items()) {
      if (!expected.contains(key)) continue;
      if (key != "samples" || !value.is_array() || !expected[key].is_array()) {
        value = SelectGoldenSamples(expected[key], std::move(value));
        continue;
      }
      std::map<int64_t, Json> by_idx;
      for (Json& sample : value) {
        const int64_t idx = sample.value("idx", int64_t{-1});
        by_idx[idx] = std::move(sample);
      }
      Json selected = Json::array();
      for (const Json& wanted : expected[key]) {
        auto it = by_idx.find(wanted.value("idx", int64_t{-1}));
        selected.push_back(it != by_idx.end() ? it->second : Json{{"idx", wanted["idx"]}});
      }
      value = std::move(selected);
    }
  } else if (expected.is_array() && actual.is_array()) {
    for (size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
      actual[i] = SelectGoldenSamples(expected[i], std::move(actual[i]));
    }
  }
  return actual;
}

}  // namespace keel::sampling
