#include "checkpoint/hf_import.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/quote.h"
#include "base/status.h"
#include "checkpoint/safetensors.h"
#include "parallel/layout.h"
#include "torch/types.h"

namespace keel::checkpoint {
namespace {

using base::Quote;
using base::ShapeString;

// At most this many problems are listed in one error (a count says how many more).
constexpr size_t kMaxListedProblems = 20;

// The files of the directory, each with the names of the tensors it holds by the index (empty
// for the single file: all of them). The single file first, as transformers' from_pretrained
// looks for it before the index.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> FilesOf(
    const std::string& directory, const HfFileNames& names) {
  if (!base::IsDirectory(directory)) {
    return absl::NotFoundError(absl::StrCat(directory, ": no such directory"));
  }
  const std::string single_file = absl::StrCat(names.stem, ".safetensors");
  const std::string index_file = absl::StrCat(names.stem, ".safetensors.index.json");
  const std::string single = base::JoinPath(directory, single_file);
  if (base::PathExists(single)) {
    return std::map<std::string, std::vector<std::string>>{{single, {}}};
  }
  const std::string index_path = base::JoinPath(directory, index_file);
  if (!base::PathExists(index_path)) {
    return absl::NotFoundError(
        absl::StrCat(directory, " holds neither ", single_file, " nor ", index_file));
  }
  absl::StatusOr<base::Json> index = base::ReadJsonFile(index_path);
  if (!index.ok()) return absl::DataLossError(index.status().message());
  const base::Json* map =
      index->is_object() && index->contains("weight_map") ? &(*index)["weight_map"] : nullptr;
  if (map == nullptr || !map->is_object()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::vector<std::string>> files;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": weight_map[", Quote(name), "] is not a file name"));
    }
    const std::string path = base::JoinPath(directory, file.get<std::string>());
    if (!base::PathExists(path)) {
      return absl::NotFoundError(
          absl::StrCat(index_path, " maps ", Quote(name), " to ", path, ", which does not exist"));
    }
    files[path].push_back(name);
  }
  return files;
}

std::string Describe(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  return absl::StrCat(ShapeString(shape), " ", c10::toString(dtype));
}

// Whether a tensor of `in_file` loads into one of `in_model`: the same dtype, or two floating
// dtypes (converted on the copy, as transformers loads bf16 files into a float32 model).
bool Loads(at::ScalarType in_file, at::ScalarType in_model) {
  return in_file == in_model || (c10::isFloatingType(in_file) && c10::isFloatingType(in_model));
}

// The whole tensor's shape in the model.
std::vector<int64_t> GlobalShape(const TensorRef& ref) {
  return ref.layout.has_value() ? ref.layout->global_shape : ref.tensor.sizes().vec();
}

// This rank's block for `ref` of the tensor `entry` of a file, read alone, in the file's dtype;
// the rows past the file's (a padded vocabulary's padding) are zeros. Requires: Mismatches
// found nothing (the entry has the model's rank).
absl::StatusOr<at::Tensor> ReadBlock(const std::string& path, const SafetensorsHeader& header,
                                     const SafetensorsEntry& entry, const TensorRef& ref) {
  const std::vector<int64_t> shape = ref.tensor.sizes().vec();
  if (entry.shape.size() != shape.size()) {
    return absl::InternalError(absl::StrCat(Quote(entry.name), ": ", entry.shape.size(),
                                            " dimensions in ", path, ", ", shape.size(),
                                            " in the model"));
  }
  const std::vector<int64_t> offsets =
      ref.layout.has_value() ? ref.layout->offsets : std::vector<int64_t>(shape.size(), 0);
  if (shape.empty()) return ReadSafetensorsBlock(path, header, entry, offsets, shape);
  const int64_t in_file = std::clamp<int64_t>(entry.shape[0] - offsets[0], 0, shape[0]);
  std::vector<int64_t> read = shape;
  read[0] = in_file;
  at::Tensor block;
  if (in_file > 0) {
    KEEL_ASSIGN_OR_RETURN(block, ReadSafetensorsBlock(path, header, entry, offsets, read));
  }
  if (in_file == shape[0]) return block;
  std::vector<int64_t> padding = shape;
  padding[0] = shape[0] - in_file;
  const at::Tensor zeros = at::zeros(padding, at::TensorOptions().dtype(entry.dtype));
  return in_file > 0 ? at::cat({block, zeros}) : zeros;
}

// The shape `ref` (whose key is `key`) must have in the files: its whole shape, or with the
// vocabulary's rows without their padding when the files hold those (`unpadded_rows`).
std::vector<int64_t> ShapeInFiles(const std::string& key, const TensorRef& ref,
                                  const SafetensorsEntry& entry,
                                  const std::map<std::string, int64_t>& unpadded_rows) {
  std::vector<int64_t> shape = GlobalShape(ref);
  const auto rows = unpadded_rows.find(key);
  if (rows != unpadded_rows.end() && !shape.empty() && !entry.shape.empty() &&
      entry.shape[0] == rows->second) {
    shape[0] = rows->second;
  }
  return shape;
}

// A problem with the tensor `name` of the files that the model holds as `ref` under `key`
// (`name` itself, or the key a tied weight is tied to), or "" if none.
std::string Disagreement(const std::string& name, const SafetensorsEntry& entry,
                         const std::string& key, const TensorRef& ref,
                         const std::map<std::string, int64_t>& unpadded_rows) {
  const std::string what =
      name == key ? Quote(name) : absl::StrCat(Quote(name), " (tied to ", Quote(key), ")");
  const std::vector<int64_t> shape = ShapeInFiles(key, ref, entry, unpadded_rows);
  if (entry.shape != shape) {
    return absl::StrCat(what, ": shape ", ShapeString(entry.shape), " in the files, ",
                        ShapeString(shape), " in the model");
  }
  if (!Loads(entry.dtype, ref.tensor.scalar_type())) {
    return absl::StrCat(what, ": dtype ", c10::toString(entry.dtype), " in the files, ",
                        c10::toString(ref.tensor.scalar_type()),
                        " in the model (a floating dtype loads into any floating dtype)");
  }
  return "";
}

// Every way the files' headers and the model's keys disagree, one line each.
std::vector<std::string> Mismatches(const std::map<std::string, SafetensorsEntry>& in_files,
                                    const State& expected,
                                    const std::map<std::string, std::string>& tied,
                                    const std::set<std::string>& held_elsewhere,
                                    const std::map<std::string, int64_t>& unpadded_rows) {
  std::vector<std::string> problems;
  for (const auto& [key, ref] : expected.tensors) {
    const auto it = in_files.find(key);
    if (it == in_files.end()) {
      problems.push_back(absl::StrCat("missing tensor ", Quote(key), " (the model's is ",
                                      Describe(GlobalShape(ref), ref.tensor.scalar_type()), ")"));
    } else if (std::string problem = Disagreement(key, it->second, key, ref, unpadded_rows);
               !problem.empty()) {
      problems.push_back(std::move(problem));
    }
  }
  for (const auto& [name, entry] : in_files) {
    if (const auto tied_to = tied.find(name); tied_to != tied.end()) {
      const std::string& key = tied_to->second;
      if (std::string problem =
              Disagreement(name, entry, key, expected.tensors.at(key), unpadded_rows);
          !problem.empty()) {
        problems.push_back(std::move(problem));
      }
    } else if (expected.tensors.count(name) == 0 && held_elsewhere.count(name) == 0) {
      problems.push_back(absl::StrCat("unexpected tensor ", Quote(name), " (",
                                      Describe(entry.shape, entry.dtype), ")"));
    }
  }
  return problems;
}

// The first kMaxListedProblems of `problems`, joined, and how many more there are.
std::string List(const std::vector<std::string>& problems) {
  if (problems.size() <= kMaxListedProblems) return absl::StrJoin(problems, "; ");
  return absl::StrCat(absl::StrJoin(problems.begin(), problems.begin() + kMaxListedProblems, "; "),
                      "; and ", problems.size() - kMaxListedProblems, " more");
}

// `by_key` under the names of `names` (a tied weight's own key included). Errors:
// kInvalidArgument when two keys get one name.
template <typename V>
absl::StatusOr<std::map<std::string, V>> Renamed(std::map<std::string, V> by_key,
                                                 const HfFileNames& names) {
  std::map<std::string, V> renamed;
  std::map<std::string, std::string> key_of;
  for (auto& [key, value] : by_key) {
    std::string name = names.name_in_files(key);
    if (const auto [it, first] = key_of.emplace(name, key); !first) {
      return absl::InvalidArgumentError(absl::StrCat("the model's keys ", Quote(it->second),
                                                     " and ", Quote(key), " both have the name ",
                                                     Quote(name), " in the files"));
    }
    renamed.emplace(std::move(name), std::move(value));
  }
  return renamed;
}

// The headers of a directory's files, and its tensors by name.
struct HfFiles {
  std::map<std::string, SafetensorsHeader> headers;  // by path
  std::map<std::string, SafetensorsEntry> tensors;
};

absl::StatusOr<HfFiles> ReadHfFiles(const std::string& directory, const HfFileNames& names) {
  KEEL_ASSIGN_OR_RETURN(auto files, FilesOf(directory, names));
  HfFiles read;
  std::map<std::string, SafetensorsEntry>& in_files = read.tensors;
  std::map<std::string, std::string> file_of;  // tensor name -> the file holding it
  std::map<std::string, SafetensorsHeader>& headers = read.headers;
  for (const auto& [path, indexed] : files) {
    KEEL_ASSIGN_OR_RETURN(headers[path], ReadSafetensorsHeader(path));
    for (const SafetensorsEntry& entry : headers[path].entries) {
      if (const auto [it, first] = file_of.emplace(entry.name, path); !first) {
        return absl::DataLossError(absl::StrCat(directory, ": tensor ", Quote(entry.name),
                                                " is in both ", it->second, " and ", path,
                                                "; a tensor may be in one file only"));
      }
      in_files.emplace(entry.name, entry);
    }
    for (const std::string& name : indexed) {
      if (const auto it = file_of.find(name); it == file_of.end() || it->second != path) {
        return absl::DataLossError(absl::StrCat(directory, "/", names.stem,
                                                ".safetensors.index.json puts ", Quote(name),
                                                " in ", path, ", which does not hold it"));
      }
    }
  }
  return read;
}

}  // namespace

absl::StatusOr<std::map<std::string, SafetensorsEntry>> ReadHfTensors(
    const std::string& directory) {
  KEEL_ASSIGN_OR_RETURN(HfFiles files, ReadHfFiles(directory, {}));
  return std::move(files.tensors);
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadHfSafetensors(const std::string& directory,
                                                                    const HfFileNames& names) {
  KEEL_ASSIGN_OR_RETURN(const HfFiles files, ReadHfFiles(directory, names));
  std::map<std::string, at::Tensor> tensors;
  for (const auto& [path, header] : files.headers) {
    KEEL_ASSIGN_OR_RETURN(auto read, ReadSafetensorsFile(path));
    for (auto& [name, tensor] : read) tensors.emplace(std::move(name), std::move(tensor));
  }
  return tensors;
}

absl::StatusOr<HfImportResult> LoadHfSafetensors(
    const std::string& directory, torch::nn::Module& model, const ModelStateOptions& options,
    const std::set<std::string>& held_elsewhere,
    const std::map<std::string, int64_t>& unpadded_rows, const HfFileNames& names) {
  KEEL_ASSIGN_OR_RETURN(const HfFiles files, ReadHfFiles(directory, names));
  const std::map<std::string, SafetensorsEntry>& in_files = files.tensors;
  const std::map<std::string, SafetensorsHeader>& headers = files.headers;
  const ModelState state(model, options);
  KEEL_ASSIGN_OR_RETURN(State expected, state.StateDict());
  std::map<std::string, std::string> tied = state.TiedKeys();
  if (names.name_in_files) {
    KEEL_ASSIGN_OR_RETURN(expected.tensors, Renamed(std::move(expected.tensors), names));
    KEEL_ASSIGN_OR_RETURN(tied, Renamed(std::move(tied), names));
    for (auto& [name, key] : tied) key = names.name_in_files(key);
  }
  if (std::vector<std::string> problems =
          Mismatches(in_files, expected, tied, held_elsewhere, unpadded_rows);
      !problems.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(directory, " does not match the model (",
                                                      problems.size(),
                                                      " problem(s)): ", List(problems)));
  }

  HfImportResult result;
  // Tied weights in the files, as this rank's block of what they are tied to.
  std::map<std::string, at::Tensor> tied_in_files;
  at::NoGradGuard no_grad;
  for (const auto& [path, header] : headers) {
    for (const SafetensorsEntry& entry : header.entries) {
      if (const auto tied_to = tied.find(entry.name); tied_to != tied.end()) {
        KEEL_ASSIGN_OR_RETURN(tied_in_files[entry.name],
                              ReadBlock(path, header, entry, expected.tensors.at(tied_to->second)));
        continue;
      }
      const auto it = expected.tensors.find(entry.name);
      if (it == expected.tensors.end()) continue;  // held elsewhere
      KEEL_ASSIGN_OR_RETURN(const at::Tensor block, ReadBlock(path, header, entry, it->second));
      it->second.tensor.copy_(block);
      ++result.num_tensors;
    }
    result.files.push_back(path);
  }
  for (const auto& [name, block] : tied_in_files) {
    const TensorRef& ref = expected.tensors.at(tied.at(name));
    if (!at::equal(block.to(ref.tensor.scalar_type()), ref.tensor.cpu())) {
      return absl::FailedPreconditionError(
          absl::StrCat(directory, ": ", Quote(name), " is tied to ", Quote(tied.at(name)),
                       " in the model, but the files hold different values for the two"));
    }
    result.tied_checked.push_back(name);
  }
  return result;
}

}  // namespace keel::checkpoint
