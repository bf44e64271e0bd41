// Loading a model's weights from Hugging Face safetensors: a directory holding
// "model.safetensors", or "model.safetensors.index.json" and the shards its weight_map names
// (the layout of the Hub, and what ExportHfSafetensors writes); the single file when it holds
// both, as transformers' from_pretrained. The keys are ModelState's, so
// an export of a Keel checkpoint loads back into the same model. Each rank reads the bytes of
// its own blocks only (ReadSafetensorsBlock): a tensor-parallel rank its slice of each tensor,
// a pipeline stage its own layers.
//
//   KEEL_ASSIGN_OR_RETURN(HfImportResult loaded, LoadHfSafetensors("/hf/gpt", model));
#ifndef KEEL_CHECKPOINT_HF_IMPORT_H_
#define KEEL_CHECKPOINT_HF_IMPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "checkpoint/model_state.h"
#include "checkpoint/safetensors.h"
#include "torch/nn/module.h"

namespace keel::checkpoint {

// What a load read.
struct HfImportResult {
  // The safetensors files read, in order.
  std::vector<std::string> files;
  // Tensors copied into the model.
  int64_t num_tensors = 0;
  // Tied lm_head weights found in the files and checked equal to what they are tied to
  // (ModelState neither saves nor reads them; the load of the embedding refills them).
  std::vector<std::string> tied_checked;
};

// Which files of a directory a load reads, and what its tensors are called there.
struct HfFileNames {
  // The single file is "<stem>.safetensors", the index of shards "<stem>.safetensors.index.json".
  // Default: "model" (transformers' weights; peft's adapters are "adapter_model").
  std::string stem = "model";
  // The name in the files of the tensor that ModelState keys `key`; unset: the key itself.
  // Default: unset.
  std::function<std::string(const std::string& key)> name_in_files;
};

// The tensors of the directory by name, as their files' headers say (the files and the checks
// of LoadHfSafetensors; no tensor data is read). Errors: as LoadHfSafetensors' kNotFound and
// kDataLoss.
[[nodiscard]] absl::StatusOr<std::map<std::string, SafetensorsEntry>> ReadHfTensors(
    const std::string& directory);

// Copies every tensor of the directory into the parameter or buffer of `model` that
// ModelState(model, options) keys alike, in place. Strict: before anything is copied, every
// key of the model must be in the files and every tensor of the files must be a key of the
// model (or a tied lm_head weight, with the shape of what it is tied to) or of `held_elsewhere`
// (the keys of the other parts of a model split over ranks, such as pipeline stages, which
// this call leaves alone), with the same shape, and the same dtype or two floating ones (a
// bf16 file loads into a float32 model, converted as transformers converts to its dtype). A
// tensor that options.layouts lays out is compared with its global shape and gets its block.
// A key of `unpadded_rows` (a padded vocabulary) may hold that many rows in the files (Hugging
// Face's unpadded vocabulary; the model's padding rows are then zeros) or all the model's.
// Errors: kNotFound for a missing directory, a directory with neither file, or a shard that
// the index names but that is missing; kDataLoss for an index that is not a
// {"weight_map": {name: file}} object or names a tensor its file lacks, a tensor in two files
// (naming both), and as ReadSafetensorsHeader and ReadSafetensorsFile; kFailedPrecondition
// naming the missing, unexpected, mis-shaped and mis-typed tensors (with both shapes or
// dtypes; the first 20, and how many more), or a tied lm_head weight that differs from the
// tensor it is tied to (the model is then partly loaded). Names from the files are quoted as
// JSON strings, ASCII only, cut after 200 characters. `names` says which files hold the tensors
// and under which names (the keys above, `held_elsewhere` and `unpadded_rows` are names in the
// files); errors: kInvalidArgument when it gives two keys the same name.
[[nodiscard]] absl::StatusOr<HfImportResult> LoadHfSafetensors(
    const std::string& directory, torch::nn::Module& model, const ModelStateOptions& options = {},
    const std::set<std::string>& held_elsewhere = {},
    const std::map<std::string, int64_t>& unpadded_rows = {}, const HfFileNames& names = {});

// Every tensor of the directory's files (LoadHfSafetensors' files, read as `names` says), whole,
// on the CPU and as the files hold them, by their names there: all of a model in memory, for
// tools that rewrite one. Errors: as ReadHfTensors and ReadSafetensorsFile.
[[nodiscard]] absl::StatusOr<std::map<std::string, at::Tensor>> ReadHfSafetensors(
    const std::string& directory, const HfFileNames& names = {});

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_HF_IMPORT_H_
