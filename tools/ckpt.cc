// Looks into Keel checkpoints: prints what one holds, checks every byte, compares two tensor by
// tensor, and exports a model as Hugging Face sharded safetensors, a LoRA run's adapter as
// Hugging Face peft's adapter directory or merged into its base.
//
//   bazel run //tools:ckpt -- inspect runs/gpt/checkpoints/step_0000001000
//   bazel run //tools:ckpt -- verify runs/gpt/checkpoints   # a run's newest checkpoint
//   bazel run //tools:ckpt -- diff runs/a/step_0000001000 runs/b/step_0000001000
//   bazel run //tools:ckpt -- export-safetensors runs/gpt/checkpoints hf/ --object=model
//   bazel run //tools:ckpt -- export-safetensors runs/lora/checkpoints adapter/ [--merge]
//
// Exit status (tools/cli/exit_code.h): 0 when verified or identical; 1 when verify finds
// problems, diff finds differences, or a checkpoint cannot be read; 2 for bad usage.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_state.h"
#include "checkpoint/reader.h"
#include "models/hf_config.h"
#include "models/model_options.h"
#include "peft/lora_options.h"
#include "peft/peft_format.h"
#include "tools/cli/exit_code.h"
#include "tools/cli/flags.h"
#include "tools/cli/user_path.h"
#include "tools/recipe/options.h"

ABSL_FLAG(int64_t, max_shard_bytes, keel::checkpoint::HfExportOptions().max_shard_bytes,
          "export-safetensors: start a new file when the next tensor would pass this many bytes.");
ABSL_FLAG(std::string, object, keel::checkpoint::HfExportOptions().object,
          "export-safetensors: the object whose tensors are exported.");
ABSL_FLAG(std::string, dtype, "",
          "export-safetensors: the floating-point tensors' dtype, bfloat16 or float32; empty: "
          "the model's (bfloat16 for a model.bf16 run, whose checkpoints hold float32 main "
          "parameters; else as saved).");
ABSL_FLAG(bool, merge, false,
          "export-safetensors of a LoRA run's checkpoint: the whole model with the adapter merged "
          "into its base (read from the run's model.pretrained_path), as peft's "
          "merge_and_unload(), instead of peft's adapter directory.");
ABSL_FLAG(std::string, config_from, "",
          "export-safetensors: a Hugging Face directory whose config.json keys other than the "
          "model's (token ids, generation settings) the exported config.json keeps, and whose "
          "tokenizer and generation_config.json files are copied beside it; empty: the run's "
          "model.pretrained_path when it holds a config.json.");

namespace keel::tools {
namespace {

using base::Json;
using checkpoint::CheckpointReader;
using checkpoint::Manifest;
using checkpoint::TensorEntry;

constexpr char kUsage[] = R"(Looks into Keel checkpoints.

Usage: ckpt <command> ARGS [flags]

Commands:
  inspect DIR                  step, tensors, files and values of the checkpoint DIR
  verify DIR                   checks every byte of DIR; for a run's checkpoint_dir, of the
                               checkpoint a resume would pick
  diff A B                     compares two checkpoints tensor by tensor and value by value
  export-safetensors DIR OUT   writes one object of DIR (for a run's checkpoint_dir, of its
                               newest valid checkpoint) as Hugging Face safetensors into OUT;
                               a Llama-style model of tools:train as transformers loads it:
                               config.json, the vocabulary without its padding rows
                               [--object=model] [--max_shard_bytes=5368709120]
                               [--dtype=bfloat16|float32] [--config_from=HF_DIR]
                               A LoRA run's checkpoint (its adapters under "base_model.model."):
                               Hugging Face peft's adapter directory (adapter_config.json,
                               adapter_model.safetensors; float32 unless --dtype), which
                               peft.PeftModel.from_pretrained loads over the run's base; with
                               --merge, the base of model.pretrained_path with the adapter
                               merged, as the full export above (peft's merge_and_unload())

Exit status: 0 verified or identical; 1 problems or differences found, or an error;
2 bad usage.)";

std::string Shape(const TensorEntry& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ", "), "]");
}

uint64_t TensorBytes(const TensorEntry& tensor) {
  uint64_t bytes = 0;
  for (const checkpoint::Chunk& chunk : tensor.chunks()) bytes += chunk.byte_length();
  return bytes;
}

// Prints rows in aligned columns, indented by two spaces; `right` marks numeric columns.
void PrintTable(const std::vector<std::string>& header, const std::vector<bool>& right,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string padding(widths[c] - row[c].size(), ' ');
      absl::StrAppend(&line, "  ", right[c] ? padding : "", row[c], right[c] ? "" : padding);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    std::cout << line << "\n";
  };
  print(header);
  for (const auto& row : rows) print(row);
}

// The objects' values: one row per object, or, when some object holds values per rank, a
// "rank" column with one row per rank of those ("all" for values saved once).
absl::Status PrintObjects(const CheckpointReader& reader) {
  const Manifest& manifest = reader.manifest();
  const bool per_rank = checkpoint::ObjectsWithValuesPerRank(manifest) > 0;
  std::vector<std::vector<std::string>> rows;
  for (const checkpoint::ObjectEntry& object : manifest.objects()) {
    if (object.rank_values().empty()) {
      KEEL_ASSIGN_OR_RETURN(Json values, reader.ReadValues(object.name()));
      rows.push_back({object.name(), values.dump()});
      if (per_rank) rows.back().insert(rows.back().begin() + 1, "all");
      continue;
    }
    KEEL_ASSIGN_OR_RETURN(std::vector<Json> each, reader.ReadValuesOfEachRank(object.name()));
    for (size_t rank = 0; rank < each.size(); ++rank) {
      rows.push_back({object.name(), absl::StrCat(rank), each[rank].dump()});
    }
  }
  std::cout << "objects:\n";
  if (per_rank) {
    PrintTable({"name", "rank", "values"}, {false, true, false}, rows);
  } else {
    PrintTable({"name", "values"}, {false, false}, rows);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Inspect(const std::string& dir) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  const Manifest& manifest = reader->manifest();
  std::cout << "checkpoint " << dir << "\n"
            << "step " << manifest.step() << ", epoch " << manifest.epoch() << ", world size "
            << manifest.world_size() << ", format "
            << checkpoint::ShardFormat_Name(manifest.shard_format()) << ", Keel "
            << manifest.keel_version() << " (format version " << manifest.format_version() << ")\n";

  uint64_t tensor_bytes = 0;
  std::vector<std::vector<std::string>> rows;
  for (const TensorEntry& tensor : manifest.tensors()) {
    tensor_bytes += TensorBytes(tensor);
    rows.push_back({tensor.name(), tensor.dtype(), Shape(tensor),
                    absl::StrCat(tensor.chunks_size()), absl::StrCat(TensorBytes(tensor))});
  }
  std::cout << "tensors:\n";
  PrintTable({"name", "dtype", "shape", "chunks", "bytes"}, {false, false, false, true, true},
             rows);

  uint64_t file_bytes = 0;
  rows.clear();
  for (const checkpoint::FileEntry& file : manifest.files()) {
    file_bytes += file.size();
    rows.push_back({file.name(), absl::StrCat(file.rank()), absl::StrCat(file.size())});
  }
  std::cout << "files:\n";
  PrintTable({"name", "rank", "bytes"}, {false, true, true}, rows);

  KEEL_RETURN_IF_ERROR(PrintObjects(*reader));
  std::cout << "total: " << manifest.tensors_size() << " tensors, " << tensor_bytes
            << " tensor bytes; " << manifest.files_size() << " files, " << file_bytes
            << " bytes on disk; " << manifest.objects_size() << " objects";
  if (const int64_t per_rank = checkpoint::ObjectsWithValuesPerRank(manifest); per_rank > 0) {
    std::cout << " (" << per_rank << " with values per rank)";
  }
  std::cout << "\n";
  return cli::kExitSuccess;
}

// A run's checkpoint_dir: the checkpoint a resume would load, the newest that verifies every
// byte (with its report); the newer ones that fail, which a resume sets aside, are printed.
// latest is unset when none verifies. Errors: kNotFound when `dir` holds no checkpoint at all.
absl::StatusOr<checkpoint::FindResult> NewestValid(const std::string& dir) {
  KEEL_ASSIGN_OR_RETURN(checkpoint::FindResult found,
                        checkpoint::FindLatest(dir, checkpoint::VerifyLevel::kChecksums));
  for (const std::string& warning : found.warnings) {
    std::cout << "warning: " << warning << " (a resume sets it aside)\n";
  }
  if (found.latest) {
    std::cout << "newest valid checkpoint: " << found.latest->path << "\n";
  } else if (found.warnings.empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir, " holds neither a checkpoint manifest nor committed step_* checkpoint directories"));
  }
  return found;
}

absl::StatusOr<int> Verify(const std::string& dir) {
  std::string path = dir;
  std::optional<checkpoint::VerifyReport> verified;
  if (base::PathExists(checkpoint::ManifestPath(dir))) {
    KEEL_ASSIGN_OR_RETURN(verified, checkpoint::Verify(path, checkpoint::VerifyLevel::kChecksums));
  } else {
    KEEL_ASSIGN_OR_RETURN(checkpoint::FindResult found, NewestValid(dir));
    if (!found.latest) {
      std::cout << "FAILED: no checkpoint under " << dir << " passes verification\n";
      return cli::kExitFailure;
    }
    path = found.latest->path;
    verified = std::move(found.report);
  }
  const checkpoint::VerifyReport& report = *verified;
  if (!report.ok()) {
    std::cout << "FAILED: " << path << "\n";
    for (const checkpoint::VerifyProblem& problem : report.problems) {
      std::cout << "  " << problem.message << "\n";
    }
    return cli::kExitFailure;
  }
  std::cout << "OK: " << report.files << " files, " << report.tensors << " tensors, "
            << report.bytes << " bytes verified; " << report.objects << " objects";
  if (report.objects_with_values_per_rank > 0) {
    std::cout << " (" << report.objects_with_values_per_rank << " with values per rank)";
  }
  std::cout << "\n";
  return cli::kExitSuccess;
}

// The difference between two tensors of the same dtype and shape, computed in double (complex
// double for complex dtypes): "" if their bytes are identical.
absl::StatusOr<std::string> TensorDifference(const at::Tensor& a, const at::Tensor& b) {
  if (std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0) return std::string();
  double max_abs = 0;
  double relative = 0;
  KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "comparing tensors", [&] {
    const at::ScalarType wide = a.is_complex() ? at::kComplexDouble : at::kDouble;
    const at::Tensor x = a.to(wide);
    const at::Tensor delta = x - b.to(wide);
    max_abs = delta.abs().max().item<double>();
    const double delta_norm = delta.norm().item<double>();
    const double norm = x.norm().item<double>();
    relative = norm > 0 ? delta_norm / norm
                        : (delta_norm > 0 ? std::numeric_limits<double>::infinity() : 0);
  }));
  return absl::StrFormat("max |A-B| %.6g, ||A-B||/||A|| %.6g", max_abs, relative);
}

// One line per leaf where `a` and `b` differ, named by its path from `path`.
void DiffValues(const std::string& path, const Json& a, const Json& b,
                std::vector<std::string>& lines) {
  if (a == b) return;
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string child = absl::StrCat(path, ".", key);
      if (b.contains(key)) {
        DiffValues(child, value, b.at(key), lines);
      } else {
        lines.push_back(absl::StrCat(child, ": only in A (", value.dump(), ")"));
      }
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key)) {
        lines.push_back(absl::StrCat(path, ".", key, ": only in B (", value.dump(), ")"));
      }
    }
    return;
  }
  lines.push_back(absl::StrCat(path, ": ", a.dump(), " in A, ", b.dump(), " in B"));
}

// The differences of `object`'s values between checkpoints `a` and `b`: compared as a whole
// when each saved them once, else rank by rank ("<object>[rank r]").
absl::StatusOr<std::vector<std::string>> DiffObject(const std::string& object,
                                                    const CheckpointReader& a,
                                                    const CheckpointReader& b) {
  absl::StatusOr<std::vector<Json>> a_each = a.ReadValuesOfEachRank(object);
  absl::StatusOr<std::vector<Json>> b_each = b.ReadValuesOfEachRank(object);
  std::vector<std::string> lines;
  if (!a_each.ok() || !b_each.ok()) {
    if (a_each.ok() == b_each.ok()) return a_each.status();
    lines.push_back(absl::StrCat(object, ": only in ", a_each.ok() ? "A" : "B"));
    return lines;
  }
  absl::StatusOr<Json> a_once = a.ReadValues(object);
  absl::StatusOr<Json> b_once = b.ReadValues(object);
  if (a_once.ok() && b_once.ok()) {
    DiffValues(object, *a_once, *b_once, lines);
  } else if (a_each->size() != b_each->size()) {
    lines.push_back(absl::StrCat(object, ": values of ", a_each->size(), " ranks in A, ",
                                 b_each->size(), " in B"));
  } else {
    for (size_t rank = 0; rank < a_each->size(); ++rank) {
      DiffValues(absl::StrCat(object, "[rank ", rank, "]"), (*a_each)[rank], (*b_each)[rank],
                 lines);
    }
  }
  return lines;
}

absl::StatusOr<int> Diff(const std::string& a_path, const std::string& b_path) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> a, CheckpointReader::Open(a_path));
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> b, CheckpointReader::Open(b_path));
  std::cout << "A: " << a_path << " (step " << a->manifest().step() << ", epoch "
            << a->manifest().epoch() << ")\n"
            << "B: " << b_path << " (step " << b->manifest().step() << ", epoch "
            << b->manifest().epoch() << ")\n";

  std::map<std::string, const TensorEntry*> a_tensors;
  std::map<std::string, const TensorEntry*> b_tensors;
  std::set<std::string> names;
  for (const TensorEntry& t : a->manifest().tensors()) a_tensors[t.name()] = &t;
  for (const TensorEntry& t : b->manifest().tensors()) b_tensors[t.name()] = &t;
  for (const auto& [name, tensor] : a_tensors) names.insert(name);
  for (const auto& [name, tensor] : b_tensors) names.insert(name);
  int differences = 0;
  int equal = 0;
  for (const std::string& name : names) {
    auto in_a = a_tensors.find(name);
    auto in_b = b_tensors.find(name);
    std::string line;
    if (in_b == b_tensors.end()) {
      line = "only in A";
    } else if (in_a == a_tensors.end()) {
      line = "only in B";
    } else if (in_a->second->dtype() != in_b->second->dtype() ||
               Shape(*in_a->second) != Shape(*in_b->second)) {
      line = absl::StrCat(in_a->second->dtype(), " ", Shape(*in_a->second), " in A, ",
                          in_b->second->dtype(), " ", Shape(*in_b->second), " in B");
    } else {
      KEEL_ASSIGN_OR_RETURN(at::Tensor x, a->ReadTensor(name));
      KEEL_ASSIGN_OR_RETURN(at::Tensor y, b->ReadTensor(name));
      KEEL_ASSIGN_OR_RETURN(line, TensorDifference(x, y));
    }
    if (line.empty()) {
      ++equal;
      continue;
    }
    ++differences;
    std::cout << "tensor " << name << ": " << line << "\n";
  }

  std::set<std::string> objects;
  for (const auto& object : a->manifest().objects()) objects.insert(object.name());
  for (const auto& object : b->manifest().objects()) objects.insert(object.name());
  for (const std::string& object : objects) {
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> lines, DiffObject(object, *a, *b));
    for (const std::string& line : lines) std::cout << "values " << line << "\n";
    differences += static_cast<int>(lines.size());
  }

  if (differences == 0) {
    std::cout << "identical: " << equal << " tensors, " << objects.size() << " objects\n";
    return cli::kExitSuccess;
  }
  std::cout << differences << " differences; " << equal << " tensors identical\n";
  return cli::kExitFailure;
}

// The configuration a trainer's checkpoint holds (kConfigState); nullopt for another's.
absl::StatusOr<std::optional<Json>> TrainerConfig(const std::string& dir) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  absl::StatusOr<Json> config = reader->ReadValues(recipe::kConfigState);
  if (absl::IsNotFound(config.status())) return std::nullopt;
  KEEL_RETURN_IF_ERROR(config.status());
  return *std::move(config);
}

// --dtype, or the dtype of the model of a trainer's checkpoint (its configuration's bf16).
absl::StatusOr<std::optional<at::ScalarType>> ExportDtype(const std::optional<Json>& config,
                                                          const std::string& flag) {
  if (flag == "bfloat16") return at::kBFloat16;
  if (flag == "float32") return at::kFloat;
  if (!flag.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", flag, ": allowed: bfloat16, float32, or empty (the model's)"));
  }
  if (!config.has_value()) return std::nullopt;  // not a trainer's
  const auto bf16 = config->find(recipe::kBf16Field);
  if (bf16 != config->end() && bf16->is_boolean() && bf16->get<bool>()) return at::kBFloat16;
  return std::nullopt;
}

// A Hugging Face directory's files beside the weights and config.json that an export takes
// along from the directory its config.json builds on: the tokenizer and generation settings.
constexpr const char* kHfCompanionFiles[] = {"generation_config.json",
                                             "merges.txt",
                                             "special_tokens_map.json",
                                             "tokenizer.json",
                                             "tokenizer.model",
                                             "tokenizer_config.json",
                                             "vocab.json"};

// --config_from where the export writes no config.json (`why`): refused, not ignored.
absl::Status CheckNoConfigFrom(absl::string_view why) {
  const std::string from = absl::GetFlag(FLAGS_config_from);
  if (from.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--config_from=", from, ": this export writes no config.json (", why, "); allowed: unset"));
}

// What the export of a trainer's Llama-style model adds to its tensors: config.json (over
// --config_from's, or the run's pretrained directory's) and the unpadded vocabulary. Prints
// where config.json's other keys came from, and returns that directory (empty: none); leaves
// `options` alone for the GPT.
absl::StatusOr<std::string> AddHfModel(const Json& trainer_config,
                                       checkpoint::HfExportOptions& options) {
  KEEL_ASSIGN_OR_RETURN(const recipe::SavedModel saved, recipe::ReadSavedModel(trainer_config));
  if (saved.options.family == models::ModelFamily::kGpt) {
    KEEL_RETURN_IF_ERROR(
        CheckNoConfigFrom("model.family gpt, whose layout no Hugging Face class has"));
    std::cout << "model.family gpt: Keel's tensor names, no config.json (no Hugging Face class "
                 "has the GPT's layout)\n";
    return std::string();
  }
  std::string base_dir = absl::GetFlag(FLAGS_config_from);
  if (base_dir.empty() && !saved.pretrained_path.empty() &&
      base::PathExists(models::HfConfigPath(saved.pretrained_path))) {
    base_dir = saved.pretrained_path;
  }
  Json base = Json::object();
  if (!base_dir.empty()) {
    KEEL_ASSIGN_OR_RETURN(base, base::ReadJsonFile(models::HfConfigPath(base_dir)));
  }
  const at::ScalarType dtype = options.dtype.value_or(at::kFloat);
  KEEL_ASSIGN_OR_RETURN(
      options.config,
      models::OptionsToHfConfig(saved.options, dtype == at::kBFloat16 ? "bfloat16" : "float32",
                                std::move(base)));
  options.unpadded_rows = models::HfVocabRows(saved.options);
  std::cout << "config.json: model.family " << models::AbslUnparseFlag(saved.options.family)
            << (base_dir.empty()
                    ? ""
                    : absl::StrCat(", other keys from ", models::HfConfigPath(base_dir)))
            << "\n";
  return base_dir;
}

// Copies kHfCompanionFiles that `from` holds into `to`; their names.
absl::StatusOr<std::vector<std::string>> CopyCompanionFiles(const std::string& from,
                                                            const std::string& to) {
  std::vector<std::string> copied;
  for (const char* name : kHfCompanionFiles) {
    const std::string source = base::JoinPath(from, name);
    if (!base::PathExists(source)) continue;
    KEEL_ASSIGN_OR_RETURN(const std::string contents, base::ReadFile(source));
    KEEL_RETURN_IF_ERROR(base::WriteFileAtomically(base::JoinPath(to, name), contents));
    copied.push_back(name);
  }
  return copied;
}

// Prints what an export wrote.
void PrintExport(const checkpoint::HfExportResult& result, const std::string& what,
                 const std::optional<at::ScalarType>& dtype, const std::string& out) {
  std::cout << "wrote " << result.num_tensors << " tensors (" << result.total_size << " bytes) of "
            << what << (dtype ? absl::StrCat(" in ", c10::toString(*dtype)) : "") << " to " << out
            << ":\n";
  for (const std::string& file : result.files) std::cout << "  " << file << "\n";
}

// Whether `object` of the checkpoint holds a LoRA adapter: keys under peft's
// "base_model.model." (checkpoint::ModelState with is_peft).
absl::StatusOr<bool> HoldsLoraAdapter(const std::string& dir, const std::string& object) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  const std::string prefix = absl::StrCat(object, "/", checkpoint::kPeftPrefix);
  for (const TensorEntry& tensor : reader->manifest().tensors()) {
    if (absl::StartsWith(tensor.name(), prefix)) return true;
  }
  return false;
}

// A LoRA run's checkpoint: peft's adapter directory, or with --merge the merged model.
absl::StatusOr<int> ExportLora(const std::string& dir, const std::string& out,
                               const std::string& object, const std::optional<Json>& config) {
  if (!config.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir,
        " holds a LoRA adapter but no trainer configuration, whose peft section gives the "
        "alpha and dropout adapter_config.json needs"));
  }
  KEEL_ASSIGN_OR_RETURN(const recipe::SavedModel saved, recipe::ReadSavedModel(*config));
  if (!saved.peft.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir,
                     " holds a LoRA adapter but its trainer configuration has no \"peft\" section, "
                     "whose alpha and dropout adapter_config.json needs"));
  }
  const peft::LoraOptions& lora = *saved.peft;
  KEEL_ASSIGN_OR_RETURN(const auto adapter, peft::ReadCheckpointAdapter(dir, object));
  const std::string flag = absl::GetFlag(FLAGS_dtype);
  if (absl::GetFlag(FLAGS_merge)) {
    if (saved.pretrained_path.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--merge adds the adapter to the run's base model, read from its "
                       "model.pretrained_path, which ",
                       dir, "'s configuration leaves empty"));
    }
    using Tensors = std::map<std::string, at::Tensor>;
    KEEL_ASSIGN_OR_RETURN(Tensors weights, checkpoint::ReadHfSafetensors(saved.pretrained_path));
    KEEL_RETURN_IF_ERROR(base::Annotate(peft::MergePeftAdapter(adapter, lora.alpha, weights),
                                        absl::StrCat("merging into ", saved.pretrained_path)));
    checkpoint::HfExportOptions options;
    options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
    KEEL_ASSIGN_OR_RETURN(options.dtype, ExportDtype(config, flag));
    KEEL_ASSIGN_OR_RETURN(const std::string base_dir, AddHfModel(*config, options));
    KEEL_ASSIGN_OR_RETURN(checkpoint::HfExportResult result,
                          checkpoint::ExportHfTensors(weights, out, options));
    if (!base_dir.empty()) {
      KEEL_ASSIGN_OR_RETURN(const std::vector<std::string> copied,
                            CopyCompanionFiles(base_dir, out));
      result.files.insert(result.files.end(), copied.begin(), copied.end());
    }
    PrintExport(result,
                absl::StrCat(saved.pretrained_path, " with the LoRA adapter of ", dir, " merged"),
                options.dtype, out);
    return cli::kExitSuccess;
  }
  KEEL_RETURN_IF_ERROR(CheckNoConfigFrom("a peft adapter directory; with --merge, the model's"));
  peft::PeftWriteOptions options;
  options.lora_alpha = lora.alpha;
  options.lora_dropout = lora.dropout;
  options.base_model_name_or_path = saved.pretrained_path;
  if (!flag.empty()) {
    KEEL_ASSIGN_OR_RETURN(options.dtype, ExportDtype(std::nullopt, flag));
  }
  if (saved.options.family == models::ModelFamily::kGpt) {
    std::cout << "model.family gpt: Keel's module names in the adapter's keys (no Hugging Face "
                 "class has the GPT's layout)\n";
  }
  if (lora.dropout > 0 && lora.dropout_position == peft::DropoutPosition::kPost) {
    std::cout << "note: peft applies lora_dropout " << lora.dropout
              << " to A's input; the run applied it to the adapter's output "
                 "(peft.dropout_position post)\n";
  }
  KEEL_ASSIGN_OR_RETURN(const peft::PeftLoraConfig written,
                        peft::WritePeftAdapter(adapter, out, options));
  std::cout << "wrote a peft LoRA adapter (r " << written.r << ", lora_alpha " << written.lora_alpha
            << ", " << written.target_modules.size() << " modules, " << adapter.size() << " tensors"
            << (options.dtype ? absl::StrCat(" in ", c10::toString(*options.dtype)) : "") << ") of "
            << dir << " to " << out << ":\n  " << peft::kPeftWeightsName << "\n  "
            << peft::kPeftConfigName << "\n";
  return cli::kExitSuccess;
}

absl::StatusOr<int> ExportSafetensors(std::string dir, const std::string& out) {
  if (!base::PathExists(checkpoint::ManifestPath(dir))) {  // a run's checkpoint_dir
    KEEL_ASSIGN_OR_RETURN(const checkpoint::FindResult found, NewestValid(dir));
    if (!found.latest) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint under ", dir, " passes verification: nothing to export"));
    }
    dir = found.latest->path;
  }
  checkpoint::HfExportOptions options;
  options.object = absl::GetFlag(FLAGS_object);
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  KEEL_ASSIGN_OR_RETURN(const std::optional<Json> trainer_config, TrainerConfig(dir));
  KEEL_ASSIGN_OR_RETURN(const bool lora, HoldsLoraAdapter(dir, options.object));
  if (lora) return ExportLora(dir, out, options.object, trainer_config);
  if (absl::GetFlag(FLAGS_merge)) {
    return absl::InvalidArgumentError(absl::StrCat("--merge: \"", options.object, "\" of ", dir,
                                                   " holds no LoRA adapter (no tensor under ",
                                                   checkpoint::kPeftPrefix, ")"));
  }
  KEEL_ASSIGN_OR_RETURN(options.dtype, ExportDtype(trainer_config, absl::GetFlag(FLAGS_dtype)));
  std::string base_dir;
  if (trainer_config.has_value() && options.object == recipe::kModelState) {
    KEEL_ASSIGN_OR_RETURN(const recipe::SavedModel saved, recipe::ReadSavedModel(*trainer_config));
    if (saved.model_save_format == checkpoint::SerializationFormat::kSafetensors) {
      return absl::FailedPreconditionError(
          "the run saved its model with checkpoint.model_save_format \"safetensors\", whose keys "
          "drop the outer \"model.\" of Hugging Face's names; export-safetensors writes "
          "Hugging Face's names from checkpoints of model_save_format \"keel\" (the default)");
    }
    KEEL_ASSIGN_OR_RETURN(base_dir, AddHfModel(*trainer_config, options));
  } else {
    KEEL_RETURN_IF_ERROR(CheckNoConfigFrom(
        trainer_config.has_value()
            ? absl::StrCat("object \"", options.object, "\" is not the model")
            : "the checkpoint holds no trainer configuration to describe its model"));
  }
  KEEL_ASSIGN_OR_RETURN(checkpoint::HfExportResult result,
                        checkpoint::ExportHfSafetensors(dir, out, options));
  if (!base_dir.empty()) {
    KEEL_ASSIGN_OR_RETURN(const std::vector<std::string> copied, CopyCompanionFiles(base_dir, out));
    result.files.insert(result.files.end(), copied.begin(), copied.end());
  }
  PrintExport(result, absl::StrCat("\"", options.object, "\""), options.dtype, out);
  return cli::kExitSuccess;
}

absl::StatusOr<int> Run(const std::vector<std::string>& args) {
  const std::string command = args.empty() ? "" : args[0];
  const size_t operands = args.empty() ? 0 : args.size() - 1;
  if (command == "inspect" && operands == 1) return Inspect(cli::UserPath(args[1]));
  if (command == "verify" && operands == 1) return Verify(cli::UserPath(args[1]));
  if (command == "diff" && operands == 2)
    return Diff(cli::UserPath(args[1]), cli::UserPath(args[2]));
  if (command == "export-safetensors" && operands == 2) {
    return ExportSafetensors(cli::UserPath(args[1]), cli::UserPath(args[2]));
  }
  if (command.empty()) {
    std::cerr << "ckpt: no command given\n\n";
  } else {
    std::cerr << "ckpt: bad command line: " << absl::StrJoin(args, " ") << "\n\n";
  }
  std::cerr << kUsage << "\n";
  return cli::kExitUsage;
}

}  // namespace
}  // namespace keel::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(keel::tools::kUsage);
  const std::vector<char*> args = keel::tools::cli::ParseFlags(argc, argv);
  return keel::tools::cli::Exit("ckpt", keel::tools::Run({args.begin() + 1, args.end()}));
}
