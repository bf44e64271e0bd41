// The stateful protocol behind one-call checkpoints, after PyTorch DCP's Stateful (state_dict /
// load_state_dict) as NeMo AutoModel's ModelState and OptimizerState implement it: each object
// hands out its tensors by key plus plain values, and loads by pulling what it needs from a
// StateReader, which reads only the saved chunks that overlap each requested block.
//
//   class Embedding : public keel::checkpoint::Stateful {
//     absl::StatusOr<State> StateDict() const override {
//       State state;
//       state.tensors["w"] = {w_};
//       return state;
//     }
//     absl::Status LoadStateDict(StateReader& reader) override {
//       return reader.ReadTensor("w", {w_});  // in place
//     }
//   };
#ifndef KEEL_CHECKPOINT_STATE_DICT_H_
#define KEEL_CHECKPOINT_STATE_DICT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "parallel/layout.h"

namespace keel::checkpoint {

// How shard files store tensor bytes (NeMo's model_save_format): Keel's own raw bytes, each
// chunk aligned for direct I/O, or safetensors files that any safetensors reader opens.
enum class SerializationFormat { kKeel, kSafetensors };

// Parse the spellings "keel" and "safetensors" (false and an error listing them otherwise) or
// give them back; Abseil's flag hooks, so the enum also works as an absl flag.
bool AbslParseFlag(absl::string_view text, SerializationFormat* out, std::string* error);
std::string AbslUnparseFlag(SerializationFormat format);

// A tensor to save or to load into. Without a layout the tensor is whole, and every rank
// that holds it holds the same values (it is written once). With one, the tensor is the block
// of the whole tensor (layout->global_shape) that starts at layout->offsets, as large as the
// tensor (DTensor's local shard, DCP's chunk); blocks several ranks hold alike are written
// once. Checkpoints hold whole tensors, so a load may read any block of them. A layout with a
// Partial dimension cannot be saved: a partial sum is not a block.
struct TensorRef {
  at::Tensor tensor;
  std::optional<parallel::TensorLayout> layout = std::nullopt;
};

// One stateful object's state: tensors by key, and non-tensor values as a JSON object.
struct State {
  std::map<std::string, TensorRef> tensors;
  base::Json values = base::Json::object();
};

// What a saved tensor is, globally.
struct SavedTensorInfo {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};

// Differences between a checkpoint and the objects it is loaded into. Keys are
// "<stateful>/<key>".
struct LoadReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  // One line per shape or dtype mismatch, naming the key and both values.
  std::vector<std::string> mismatches;

  bool clean() const {
    return missing_keys.empty() && unexpected_keys.empty() && mismatches.empty();
  }
  // All the differences, one per line ("missing keys: a, b").
  std::string ToString() const;
};

namespace internal {
class SavedState;
}  // namespace internal

// One stateful object's view of a checkpoint during LoadStateDict. Problems with the fit
// (missing key, shape or dtype mismatch) are recorded in the load's LoadReport and leave the
// target untouched; Read* then return OK so the object can go on. Only failures to read
// (I/O, corrupt data) are errors.
class StateReader {
 public:
  // `checking`: the first pass of a strict load (see Stateful::LoadStateDict).
  StateReader(const internal::SavedState& saved, std::string scope, LoadReport& report,
              bool checking = false);

  // The first pass of a strict load: ReadTensor checks the fit (and that the saved chunks
  // cover the block) without reading a byte; the object must ask for everything it would read
  // and change nothing.
  bool checking() const { return checking_; }

  // Keys of the tensors saved under this object, sorted.
  std::vector<std::string> TensorKeys() const;
  // The saved tensor `key`, or nullptr if there is none.
  const SavedTensorInfo* FindTensor(const std::string& key) const;

  // Fills `target.tensor` (whole, or the block its layout names) from the saved tensor
  // `key`, reading only the overlapping chunks. A missing key, a different global shape or
  // dtype is recorded and leaves the target as it was.
  // Errors: kDataLoss (corrupt or truncated data, naming file and tensor), kInternal/kUnavailable
  // for I/O failures.
  [[nodiscard]] absl::Status ReadTensor(const std::string& key, const TensorRef& target);

  // Leaves the saved tensor `key` unread on purpose: it is not reported as unexpected.
  void Skip(const std::string& key);

  // The values this object saved for this rank: a JSON object. Values every saving rank saved
  // alike are saved once and given to every rank; values that differed are saved per rank,
  // and a rank gets the entry of its own rank when as many ranks load as saved (taken for the
  // same layout). Empty if the checkpoint holds nothing under this object's name (then
  // "<name>" is recorded as missing, once), or if it holds values per rank saved by another
  // number of ranks (then a mismatch is recorded, once: such an object must merge them from
  // ValuesOfEachRank).
  const base::Json& Values();
  // Whether the checkpoint holds anything under this object's name, without reporting it
  // missing: for an object added to a program after checkpoints were written without it.
  bool HasValues() const;
  // Every saving rank's values, in rank order: saved_world_size() JSON objects (values saved
  // once count as every rank's), for an object that merges or splits its values when the
  // number of ranks changed. Empty if the checkpoint holds nothing under this object's name
  // (then "<name>" is recorded as missing, once).
  std::vector<base::Json> ValuesOfEachRank();
  // The number of ranks that saved the checkpoint (1 for states held in memory).
  int saved_world_size() const;
  // Record differences an object finds in its own values, as "<name>/<key>".
  void ReportMissing(const std::string& key);
  void ReportUnexpected(const std::string& key);
  // Records a mismatch line ("<name>: <line>") for an object-specific difference.
  void ReportMismatch(const std::string& line);

 private:
  const internal::SavedState& saved_;
  std::string scope_;
  LoadReport& report_;
  bool checking_;
};

// An object whose state goes into a checkpoint.
class Stateful {
 public:
  virtual ~Stateful() = default;
  // The state to save. Tensors may alias live storage: a synchronous save writes them before
  // returning and an asynchronous one copies them first.
  [[nodiscard]] virtual absl::StatusOr<State> StateDict() const = 0;
  // Restores the state from `reader`, in place. A strict load calls it twice: first with
  // reader.checking() true, when it must read what it would read (ReadTensor, Values,
  // ValuesOfEachRank) and change nothing, so that a checkpoint that does not fit is refused
  // before any object changes; then for real.
  [[nodiscard]] virtual absl::Status LoadStateDict(StateReader& reader) = 0;
};

// Stateful objects by name; the names prefix their keys in the checkpoint ("model/...").
// Requires: the objects outlive the save or load they are passed to.
using Statefuls = std::map<std::string, Stateful*>;

// What a failed load leaves behind. A strict load checks every object's fit first (missing
// and unexpected keys, shapes, dtypes, values an object rejects, saved chunks that do not cover
// a block) and fails before any object changes. A failure while reading the bytes themselves
// (kDataLoss: a checksum, a truncated file) can come after some objects loaded: those objects
// are then partly loaded; Checkpointer::LoadLatest resets them through ResumeOptions::reset
// before trying an older checkpoint or returning the error.
struct LoadOptions {
  // Strict loads fail when the report is not clean; non-strict ones return it. Default: true.
  bool strict = true;
};

// Loads `statefuls` from states held in memory (as StateDict() returned them, keyed like
// `statefuls`), through the same protocol and checks as a checkpoint on disk.
// Errors: kInvalidArgument listing every missing/unexpected key and mismatch when strict;
// whatever a LoadStateDict returns.
[[nodiscard]] absl::StatusOr<LoadReport> LoadFromMemory(const Statefuls& statefuls,
                                                        const std::map<std::string, State>& saved,
                                                        const LoadOptions& options);

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_STATE_DICT_H_
