// Distributed, atomic, verified checkpoints: a directory per step holding a protobuf manifest
// (checkpoint/manifest.proto) and one shard file per writing rank, as PyTorch DCP's
// FileSystemWriter/Reader do for NeMo AutoModel's Checkpointer, plus checksums, an atomic
// commit, retention and resharding loads.
//
//   keel::checkpoint::CheckpointerOptions options;
//   options.checkpoint_dir = "/runs/gpt/checkpoints";
//   KEEL_ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(options, ckpt_group));
//   Statefuls statefuls = {{"model", &model_state}, {"optim", &optim_state}};
//   const StepSchedulerState at = scheduler.StateDict();  // the step a resume continues at
//   KEEL_RETURN_IF_ERROR(checkpointer->Save(statefuls, at.step, at.epoch));
//   KEEL_ASSIGN_OR_RETURN(ResumeResult resumed, checkpointer->LoadLatest(statefuls));
//
// Layout: <checkpoint_dir>/step_<step, 10 digits>/{manifest.pb, __<rank>.keel | .safetensors},
// and <checkpoint_dir>/latest naming the newest committed step directory. Saves are written
// into ".step_<step>.tmp" and renamed into place after every file is durable; checkpoints that
// do not load are moved to quarantine/.
#ifndef KEEL_CHECKPOINT_CHECKPOINT_H_
#define KEEL_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/fields.h"
#include "checkpoint/state_dict.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace keel::checkpoint {

// Mirrors the fields of NeMo AutoModel's CheckpointingConfig that apply to Keel, plus
// retention.
struct CheckpointerOptions {
  // Directory holding the step directories. Required.
  std::string checkpoint_dir;
  // Shard file format. Default: kKeel.
  SerializationFormat model_save_format = SerializationFormat::kKeel;
  // Save() snapshots the state and returns; a background thread writes and commits it.
  // Default: false.
  bool is_async = false;
  // After each commit, keep only the newest keep_last_k checkpoints (0 keeps all). Default: 0.
  int64_t keep_last_k = 0;
  // Also keep every checkpoint whose step is a multiple of this (0: none). Default: 0.
  int64_t keep_every_n_steps = 0;
};

template <typename O, typename V, base::IsFieldsOf<O, CheckpointerOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("checkpoint_dir", o.checkpoint_dir);
  v("model_save_format", o.model_save_format);
  v("is_async", o.is_async);
  v("keep_last_k", o.keep_last_k);
  v("keep_every_n_steps", o.keep_every_n_steps);
}

// What Checkpointer::Create refuses in `options`, before any checkpointer is made (a dry run):
// an empty checkpoint_dir, a negative keep_last_k or keep_every_n_steps. Errors:
// kInvalidArgument naming the field.
[[nodiscard]] absl::Status CheckCheckpointerOptions(const CheckpointerOptions& options);

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;
  int64_t epoch = 0;
};

struct ResumeOptions {
  LoadOptions load;
  // Called on every rank with each checkpoint before any of its tensors is read; an error
  // stops the search, agreed across ranks (for checks such as a configuration that must
  // match). Default: none.
  std::function<absl::Status(const CheckpointInfo&)> before_load;
  // Called on every rank after a load failed part-way, before the next older checkpoint is
  // tried or the error returned: it must put the objects back as they were before the first
  // load (loads need not overwrite everything: Megatron's scheduler adds the saved steps to its
  // own). Without it, the search ends there with `partial`. Default: none.
  std::function<absl::Status()> reset;
};

struct ResumeResult {
  // The checkpoint loaded, if one did.
  std::optional<CheckpointInfo> loaded;
  LoadReport report;
  // One line per newer checkpoint that did not load: why, and where it was moved.
  std::vector<std::string> warnings;
  // Where those checkpoints went.
  std::vector<std::string> quarantined;
  // A load failed after writing into the objects and there was no `reset`: they hold part of a
  // bad checkpoint, and the search stopped. Reset them, then call LoadLatest again.
  bool partial = false;
};

// Saves and loads the checkpoints of one training run, on every rank of `group`.
//
// Each rank writes the blocks it holds into its own shard file; a block held by several ranks
// (a replicated tensor) is written once, the work balanced by bytes. Rank 0 writes the
// manifest once every rank's file is durable, then renames the directory into place. Every
// rank returns the same status. An object's non-tensor values are written once when every
// rank's are equal, else once per rank (pipeline or expert stages); a load gives each rank its
// own when as many ranks load as saved (StateReader::Values, ValuesOfEachRank).
class Checkpointer {
 public:
  // `group` is the ranks that checkpoint together, a group that runs collectives on CPU
  // tensors (Gloo; not NCCL, even when the tensors are on GPUs); nullptr for a single process.
  // With is_async the background writer runs collectives on it, so give it a group no other
  // thread uses while a save is in flight. Errors: kInvalidArgument for bad options or a group
  // that cannot carry CPU tensors.
  // Requires: `group` outlives the Checkpointer.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Checkpointer>> Create(
      const CheckpointerOptions& options, c10d::ProcessGroup* group);
  // Waits for an in-flight save; its error, if any, is lost: call Wait() first.
  ~Checkpointer();

  // Saves `statefuls` as step `step`: the step a resume from it continues at, which with a
  // scheduling::StepScheduler is its StateDict().step (after N optimizer steps, N), so that the
  // directory's name and the saved scheduler state agree. Synchronous saves return once the
  // checkpoint is committed; asynchronous ones once their tensors are copied to host memory (CUDA
  // tensors: copies queued on the device's current stream into pinned buffers, which the writer
  // thread reads only after an event recorded behind them), so the tensors may change as soon as
  // Save returns. Either way a previous asynchronous save is finished first and its error returned.
  // Collective: over the group (an asynchronous save goes on on a background thread).
  // Errors: kAlreadyExists if the step directory exists; kInvalidArgument if ranks disagree on
  // a tensor or save different objects; kResourceExhausted for a full disk; kUnavailable for peers;
  // what StateDict() returns.
  [[nodiscard]] absl::Status Save(const Statefuls& statefuls, int64_t step, int64_t epoch);
  // Finishes the in-flight asynchronous save, if any, and returns its status. Collective: when
  // a save is in flight, its remaining exchanges.
  [[nodiscard]] absl::Status Wait();

  // Loads the checkpoint at `path` into `statefuls`, each rank reading only the chunks that
  // overlap its blocks (any world size). Retention never deletes a checkpoint loaded here.
  // Collective: over the group (the ranks agree on the outcome).
  // Errors: as LoadCheckpoint, agreed across ranks.
  [[nodiscard]] absl::StatusOr<LoadReport> Load(const std::string& path, const Statefuls& statefuls,
                                                const LoadOptions& options = {});

  // Loads the newest committed checkpoint under checkpoint_dir that loads. One that does not
  // (a checksum, a truncated or missing shard, an unreadable or missing manifest: kDataLoss or
  // kNotFound) is moved out of the committed namespace to <checkpoint_dir>/quarantine/ (never
  // deleted) with a warning, and the next older one is tried; a later save of its step does
  // not collide with it. Manifests and file sizes are checked before anything is read into
  // `statefuls`; after a checksum fails mid-load, options.reset restores them (see `partial`).
  // Collective: every rank tries the same checkpoints, and the ranks agree on each outcome;
  // rank 0 moves them. Errors: other load errors (a checkpoint that does not fit `statefuls`,
  // a newer format), before_load's, and failures to list or move, agreed across ranks.
  [[nodiscard]] absl::StatusOr<ResumeResult> LoadLatest(const Statefuls& statefuls,
                                                        const ResumeOptions& options = {});

  // The directory of the last save committed and waited for, if any.
  std::optional<std::string> last_saved() const;

 private:
  class Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

// Loads the checkpoint at `path` into `statefuls` in this process, without collectives, as
// one rank of one: values saved per rank by several ranks reach an object only through
// StateReader::ValuesOfEachRank.
// Errors: kNotFound (no checkpoint at `path`); kDataLoss naming the file and tensor for corrupt,
// truncated or missing data; kFailedPrecondition for a newer format version; kInvalidArgument
// listing missing/unexpected keys and mismatches when strict.
[[nodiscard]] absl::StatusOr<LoadReport> LoadCheckpoint(const std::string& path,
                                                        const Statefuls& statefuls,
                                                        const LoadOptions& options = {});

enum class VerifyLevel {
  // The manifest checks out and every shard file exists with its recorded size.
  kStructure,
  // Also every byte: each file's and each chunk's XXH3-64.
  kChecksums,
};

// One problem Verify found.
struct VerifyProblem {
  // The file it concerns: a shard file, or the manifest.
  std::string file;
  // The tensor ("<object>/<key>") whose chunk fails, if the problem is one chunk's.
  std::string tensor;
  // The whole problem for a person, naming the file (and tensor).
  std::string message;
};

struct VerifyReport {
  // Step and epoch are those of the manifest (0 if it could not be read).
  CheckpointInfo checkpoint;
  // What the manifest lists: files, their total bytes, tensors, objects, and the objects whose
  // ranks saved different values (held per rank).
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t tensors = 0;
  int64_t objects = 0;
  int64_t objects_with_values_per_rank = 0;
  // Every problem found; none when the checkpoint verified.
  std::vector<VerifyProblem> problems;

  bool ok() const { return problems.empty(); }
  // OK, or kDataLoss with the problems' messages.
  absl::Status ToStatus() const;
};

// Checks the checkpoint at `path` without loading it: a corrupt manifest (values per rank
// included: one entry per rank, in rank order), a missing or resized shard file, and (kChecksums)
// any chunk or file whose bytes fail their checksum are problems in the report. Errors: kNotFound
// when `path` holds no checkpoint; kFailedPrecondition for a newer format version; failures to
// read.
[[nodiscard]] absl::StatusOr<VerifyReport> Verify(const std::string& path, VerifyLevel level);

struct FindResult {
  // The newest checkpoint that passed verification, if any, and its report.
  std::optional<CheckpointInfo> latest;
  std::optional<VerifyReport> report;
  // One line per newer checkpoint that was skipped, saying why.
  std::vector<std::string> warnings;
};

// The newest committed checkpoint under `checkpoint_dir` that passes Verify(level); newer
// ones that fail are skipped with a warning. Unfinished saves are never considered.
// Errors: kNotFound if `checkpoint_dir` does not exist (an empty one gives no latest).
[[nodiscard]] absl::StatusOr<FindResult> FindLatest(const std::string& checkpoint_dir,
                                                    VerifyLevel level = VerifyLevel::kStructure);

// Deletes committed checkpoints beyond keep_last_k (keeping multiples of keep_every_n_steps),
// and leftovers of interrupted saves. Never deletes a path in `keep` or the newest checkpoint
// that verifies. Deletion renames a directory out of the committed namespace first, so a crash
// leaves no half-deleted checkpoint behind.
[[nodiscard]] absl::Status ApplyRetention(const std::string& checkpoint_dir,
                                          const CheckpointerOptions& options,
                                          const std::vector<std::string>& keep);

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_CHECKPOINT_H_
