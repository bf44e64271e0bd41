#include "checkpoint/hf_export.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "c10/core/ScalarType.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"

namespace keel::checkpoint {
namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kConfigName[] = "config.json";

// A tensor to export: its full name in the checkpoint, its key in the export, its bytes in the
// export, and the leading rows written (all: -1).
struct ExportedTensor {
  std::string name;
  std::string key;
  int64_t bytes = 0;
  int64_t rows = -1;
};

// Greedy split in order: a file takes tensors until the next one would exceed `max_bytes`.
std::vector<std::vector<const ExportedTensor*>> AssignToFiles(
    const std::vector<ExportedTensor>& tensors, int64_t max_bytes) {
  std::vector<std::vector<const ExportedTensor*>> files;
  int64_t file_bytes = 0;
  for (const ExportedTensor& tensor : tensors) {
    if (files.empty() || (!files.back().empty() && file_bytes + tensor.bytes > max_bytes)) {
      files.emplace_back();
      file_bytes = 0;
    }
    files.back().push_back(&tensor);
    file_bytes += tensor.bytes;
  }
  return files;
}

absl::Status CheckNoExport(const std::string& output_dir) {
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, base::ListDirectory(output_dir));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name == kIndexName || name == kConfigName ||
        (absl::StartsWith(name, "model") && absl::EndsWith(name, ".safetensors"))) {
      return absl::AlreadyExistsError(absl::StrCat(output_dir, " already holds an export (", name,
                                                   "); remove it or choose an empty directory"));
    }
  }
  return absl::OkStatus();
}

// The dtype a tensor saved as `saved` is written in.
at::ScalarType Written(const HfExportOptions& options, at::ScalarType saved) {
  return options.dtype.has_value() && at::isFloatingType(saved) ? *options.dtype : saved;
}

// The tensor `name` (of the source), saved as `saved` with `shape`, exported under `key`: its
// bytes in the export, with the rows that options.unpadded_rows keeps for it.
absl::StatusOr<ExportedTensor> ToExport(std::string name, std::string key, at::ScalarType saved,
                                        const std::vector<int64_t>& shape,
                                        const HfExportOptions& options) {
  ExportedTensor tensor{std::move(name), std::move(key),
                        static_cast<int64_t>(c10::elementSize(Written(options, saved)))};
  for (int64_t dim : shape) tensor.bytes *= dim;
  const auto rows = options.unpadded_rows.find(tensor.key);
  if (rows == options.unpadded_rows.end()) return tensor;
  const int64_t have = shape.empty() ? 0 : shape[0];
  if (rows->second < 1 || rows->second > have) {
    return absl::InvalidArgumentError(absl::StrCat("unpadded_rows of \"", tensor.key, "\" is ",
                                                   rows->second, "; the tensor has ", have,
                                                   " rows (allowed: 1 to ", have, ")"));
  }
  tensor.bytes = tensor.bytes / have * rows->second;
  tensor.rows = rows->second;
  return tensor;
}

absl::Status CheckOptions(const HfExportOptions& options) {
  if (options.max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes (", options.max_shard_bytes, ") must be >= 1"));
  }
  if (options.dtype.has_value() && !at::isFloatingType(*options.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype (", c10::toString(*options.dtype),
                     ") must be a floating-point dtype: bfloat16, float16 or float32"));
  }
  return absl::OkStatus();
}

// Reads the whole tensor `name` of the source, in its saved dtype.
using ReadWhole = std::function<absl::StatusOr<at::Tensor>(const std::string& name)>;

// transformers' config.json spelling: json.dumps(config, indent=2, sort_keys=True) + "\n".
std::string ConfigText(const base::Json& config) {
  return nlohmann::json::parse(config.dump()).dump(2) + "\n";
}

// Writes the export of `tensors` into `output_dir`, naming each file in result.files once it
// is written (config.json first, the index last).
absl::Status WriteExport(const std::vector<ExportedTensor>& tensors, const ReadWhole& read,
                         const HfExportOptions& options, const std::string& output_dir,
                         HfExportResult& result) {
  if (options.config.has_value()) {
    KEEL_RETURN_IF_ERROR(base::WriteFileAtomically(base::JoinPath(output_dir, kConfigName),
                                                   ConfigText(*options.config)));
    result.files.push_back(kConfigName);
  }

  const std::vector<std::vector<const ExportedTensor*>> files =
      AssignToFiles(tensors, options.max_shard_bytes);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  base::Json weight_map = base::Json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string file_name =
        files.size() == 1 ? kSingleFileName
                          : absl::StrFormat("model-%05d-of-%05d.safetensors", f + 1, files.size());
    std::vector<std::pair<std::string, at::Tensor>> contents;
    for (const ExportedTensor* tensor : files[f]) {
      KEEL_ASSIGN_OR_RETURN(at::Tensor whole, read(tensor->name));
      if (tensor->rows >= 0) whole = whole.narrow(0, 0, tensor->rows);
      contents.emplace_back(tensor->key, whole.to(Written(options, whole.scalar_type())));
      weight_map[tensor->key] = file_name;
      result.total_size += tensor->bytes;
      ++result.num_tensors;
    }
    KEEL_RETURN_IF_ERROR(
        WriteSafetensorsFile(base::JoinPath(output_dir, file_name), contents, metadata));
    result.files.push_back(file_name);
  }
  if (files.size() == 1) return absl::OkStatus();
  const base::Json index = {{"metadata", {{"total_size", result.total_size}}},
                            {"weight_map", std::move(weight_map)}};
  KEEL_RETURN_IF_ERROR(base::WriteFileAtomically(base::JoinPath(output_dir, kIndexName),
                                                 absl::StrCat(index.dump(2), "\n")));
  result.files.push_back(kIndexName);
  return absl::OkStatus();
}

// Writes `tensors` (none yet unless `what` holds them) into `output_dir`, all or nothing.
absl::StatusOr<HfExportResult> Export(std::vector<ExportedTensor> tensors, const ReadWhole& read,
                                      const std::string& what, const std::string& output_dir,
                                      const HfExportOptions& options) {
  std::sort(tensors.begin(), tensors.end(),
            [](const ExportedTensor& a, const ExportedTensor& b) { return a.key < b.key; });
  for (const auto& [key, rows] : options.unpadded_rows) {
    if (std::none_of(tensors.begin(), tensors.end(),
                     [&key = key](const ExportedTensor& t) { return t.key == key; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("unpadded_rows names \"", key, "\", which ", what, " does not hold"));
    }
  }

  KEEL_RETURN_IF_ERROR(base::MakeDirectories(output_dir));
  KEEL_RETURN_IF_ERROR(CheckNoExport(output_dir));
  HfExportResult result;
  // All or nothing: a failure removes the files written so far, so a retry finds no export.
  const absl::Status status = WriteExport(tensors, read, options, output_dir, result);
  if (!status.ok()) {
    for (const std::string& file : result.files) {
      base::RemoveTree(base::JoinPath(output_dir, file)).IgnoreError();
    }
    return status;
  }
  return result;
}

}  // namespace

absl::StatusOr<HfExportResult> ExportHfSafetensors(const std::string& checkpoint_path,
                                                   const std::string& output_dir,
                                                   const HfExportOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckOptions(options));
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(checkpoint_path));
  const Manifest& manifest = reader->manifest();
  const std::string prefix = absl::StrCat(options.object, "/");
  std::vector<ExportedTensor> tensors;
  std::set<std::string> objects;
  for (const ObjectEntry& object : manifest.objects()) objects.insert(object.name());
  for (const TensorEntry& entry : manifest.tensors()) {
    objects.insert(entry.name().substr(0, entry.name().find('/')));
    if (!absl::StartsWith(entry.name(), prefix)) continue;
    KEEL_ASSIGN_OR_RETURN(at::ScalarType dtype, internal::ParseDtype(entry.dtype()));
    KEEL_ASSIGN_OR_RETURN(ExportedTensor tensor,
                          ToExport(entry.name(), entry.name().substr(prefix.size()), dtype,
                                   {entry.shape().begin(), entry.shape().end()}, options));
    tensors.push_back(std::move(tensor));
  }
  if (tensors.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "object \"", options.object, "\" has no tensors in ", checkpoint_path,
        "; objects with state there: ", objects.empty() ? "none" : absl::StrJoin(objects, ", ")));
  }
  return Export(
      std::move(tensors), [&reader](const std::string& name) { return reader->ReadTensor(name); },
      absl::StrCat("\"", options.object, "\""), output_dir, options);
}

absl::StatusOr<HfExportResult> ExportHfTensors(const std::map<std::string, at::Tensor>& tensors,
                                               const std::string& output_dir,
                                               const HfExportOptions& options) {
  KEEL_RETURN_IF_ERROR(CheckOptions(options));
  if (tensors.empty()) return absl::InvalidArgumentError("no tensors to export");
  std::vector<ExportedTensor> exported;
  for (const auto& [key, tensor] : tensors) {
    KEEL_ASSIGN_OR_RETURN(ExportedTensor one,
                          ToExport(key, key, tensor.scalar_type(), tensor.sizes().vec(), options));
    exported.push_back(std::move(one));
  }
  return Export(
      std::move(exported),
      [&tensors](const std::string& key) -> absl::StatusOr<at::Tensor> { return tensors.at(key); },
      "the tensors", output_dir, options);
}

}  // namespace keel::checkpoint
