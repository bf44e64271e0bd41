// Consolidated Hugging Face export of one object of a Keel checkpoint: whole tensors in
// "model-0000N-of-0000M.safetensors" files plus "model.safetensors.index.json", the layout
// NeMo AutoModel's consolidated safetensors export writes (nemo_automodel
// _backports/consolidate_hf_safetensors.py, file names from _backports/hf_utils.py), the file
// layout transformers' from_pretrained reads; a model that fits one file is "model.safetensors"
// alone, as save_pretrained writes it. The tensors keep the object's own names, a padded
// vocabulary can lose its padding rows, and a config.json can go beside them (the caller knows
// the model: models/hf_config.h writes one for the Llama-style families).
//
//   keel::checkpoint::HfExportOptions options;
//   options.max_shard_bytes = int64_t{2} << 30;
//   KEEL_ASSIGN_OR_RETURN(HfExportResult result,
//                         ExportHfSafetensors("/runs/gpt/step_0000001000", "/export/gpt",
//                         options));
#ifndef KEEL_CHECKPOINT_HF_EXPORT_H_
#define KEEL_CHECKPOINT_HF_EXPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "base/json.h"
#include "c10/core/ScalarType.h"

namespace keel::checkpoint {

struct HfExportOptions {
  // The object whose tensors are exported, each under its key (without "<object>/").
  // Default: "model".
  std::string object = "model";
  // A new file starts when the next tensor would take the current one past this many tensor
  // bytes; a larger tensor gets a file of its own. Default: 5 GiB.
  int64_t max_shard_bytes = int64_t{5} << 30;
  // The dtype of the floating-point tensors written (bf16 from a bf16 run's float32 main
  // parameters: rounded to nearest even, as Tensor::to); others are written as saved.
  // Default: unset, every tensor as saved.
  std::optional<at::ScalarType> dtype;
  // Tensors written without their last rows: key -> the leading rows kept (a vocabulary padded
  // for tensor parallelism, written with its real rows as Hugging Face holds it). Default: none.
  std::map<std::string, int64_t> unpadded_rows;
  // Written as config.json before the weights, as transformers writes it (keys sorted at every
  // level, two-space indents, a final newline). Default: none written.
  std::optional<base::Json> config;
};

// What an export wrote.
struct HfExportResult {
  // Names of the files written into the output directory, the index last.
  std::vector<std::string> files;
  // Tensors exported.
  int64_t num_tensors = 0;
  // Their bytes, as the index's metadata.total_size.
  int64_t total_size = 0;
};

// Writes the tensors of `options.object` of the checkpoint at `checkpoint_path` into
// `output_dir` (created if needed) as whole tensors, assigned to files in name order. Holds
// one file's tensors in memory at a time. Each file's "__metadata__" is {"format": "pt"} and
// its header is laid out as huggingface/safetensors writes it, so the tensors a model loaded
// from save_pretrained's "model.safetensors" come back byte for byte. Several files are
// "model-0000N-of-0000M.safetensors" and the index, written last: a directory without it holds
// an unfinished export. One file is "model.safetensors", written atomically.
// Errors: kInvalidArgument for max_shard_bytes < 1, a dtype that is not floating-point, or an
// unpadded_rows entry that names no exported tensor or more rows than it has; kNotFound if the
// object has no tensors (listing the objects there are); kAlreadyExists if `output_dir` already
// holds an index, config.json or a "model*.safetensors" file; as CheckpointReader::Open and
// ReadTensor; as WriteSafetensorsFile.
[[nodiscard]] absl::StatusOr<HfExportResult> ExportHfSafetensors(
    const std::string& checkpoint_path, const std::string& output_dir,
    const HfExportOptions& options = {});

// The same export of `tensors` (whole, by key) from memory, options.object aside: a model that
// a tool rewrote (a LoRA adapter merged into its base). Errors: kInvalidArgument for no tensors;
// as ExportHfSafetensors otherwise (but for reading a checkpoint).
[[nodiscard]] absl::StatusOr<HfExportResult> ExportHfTensors(
    const std::map<std::string, at::Tensor>& tensors, const std::string& output_dir,
    const HfExportOptions& options = {});

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_HF_EXPORT_H_
