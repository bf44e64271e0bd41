// The Checkpointer, and its commit protocol.
//
// A checkpoint of step S is the directory <checkpoint_dir>/step_<S> (10 digits). A directory has
// that name only once every byte in it is durable, so whatever moment a crash or kill -9 hits,
// a reader finds complete checkpoints or none:
//   1. Plan. Every rank describes the blocks it holds and its objects' values; all ranks gather
//      every description and compute the same write plan (identical blocks written once,
//      largest first, by the least-loaded holder; an object's values once when every rank's
//      are equal, else per rank). Rank 0 clears a leftover of an earlier crash and creates the
//      temporary directory .step_<S>.tmp, which no reader takes for a checkpoint.
//   2. Shards. Each rank writes its blocks into .step_<S>.tmp/__<rank>.keel (or .safetensors),
//      hashing each byte while copying it, and fsyncs the file. The files and chunks with their
//      checksums are then gathered.
//   3. Manifest. Rank 0 merges them into the manifest, writes manifest.pb.tmp, fsyncs it, renames
//      it to manifest.pb and fsyncs the directory.
//   4. Commit. Rank 0 renames .step_<S>.tmp to step_<S> and fsyncs checkpoint_dir: the rename is
//      the commit point. It then replaces "latest" atomically (a hint for people; FindLatest
//      lists the step directories and trusts no pointer).
//   5. Agreement. Rank 0's commit status goes to every rank, so all ranks return the same status.
// A crash before 4 leaves .step_<S>.tmp, which the next save of S or retention removes; a crash
// after it leaves a complete checkpoint ("latest" may still name the one before). Every exchange
// carries each rank's status (internal/agreement.h), so one rank's failure fails all of them
// instead of leaving them waiting. An asynchronous save copies the blocks into host buffers,
// returns, and runs 2-5 on a background thread; CUDA blocks are copied non_blocking into pinned
// buffers, and the thread waits for an event recorded after the copies before reading a byte.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/collectives.h"
#include "base/files.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/internal/disk_state.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/layout.h"
#include "checkpoint/internal/manifest_io.h"
#include "checkpoint/internal/plan.h"
#include "checkpoint/internal/shard_writer.h"
#include "checkpoint/manifest.h"
#include "parallel/layout.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::checkpoint {
namespace {

std::string Dims(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// Everything steps 2-5 need; owned by the background thread while an asynchronous save runs.
struct PendingSave {
  std::string checkpoint_dir;
  // "step_<S>", and its temporary and final paths.
  std::string name;
  std::string temporary_dir;
  std::string final_dir;
  int rank = 0;
  int world_size = 1;
  SerializationFormat format = SerializationFormat::kKeel;
  std::vector<internal::WriteItem> items;
  // Asynchronous saves of CUDA tensors: one per device, done once the device-to-host copies
  // into `items` have run (the writer calls them before reading a byte).
  std::vector<std::function<void()>> copies_done;
  // Rank 0: the manifest, its tensors without chunks until step 3.
  Manifest manifest;
};

// Rank 0, steps 3 and 4.
absl::Status Commit(PendingSave& save, const std::vector<std::string>& written) {
  KEEL_RETURN_IF_ERROR(internal::MergeWritten(written, save.manifest));
  KEEL_RETURN_IF_ERROR(base::WriteFileAtomically(ManifestPath(save.temporary_dir),
                                                 internal::EncodeManifest(save.manifest)));
  KEEL_RETURN_IF_ERROR(base::RenameDurably(save.temporary_dir, save.final_dir));
  return base::WriteFileAtomically(base::JoinPath(save.checkpoint_dir, internal::kLatestName),
                                   absl::StrCat(save.name, "\n"));
}

// Steps 2-5, run by every rank (inline or on the background thread). A rank whose staging
// failed writes nothing and reports `staged`, which fails the save everywhere.
absl::Status WriteAndCommit(PendingSave& save, absl::Status staged, c10d::ProcessGroup* group) {
  if (staged.ok() && !save.copies_done.empty()) {
    staged =
        base::CallTorch(absl::StatusCode::kInternal, "waiting for the device-to-host copies", [&] {
          for (const auto& done : save.copies_done) done();
        });
  }
  absl::StatusOr<Manifest> written =
      staged.ok() ? internal::WriteShard(save.temporary_dir, save.rank, save.format, save.items)
                  : staged;
  std::string payload;
  if (written.ok()) written->SerializeToString(&payload);
  absl::StatusOr<std::vector<std::string>> results =
      base::ExchangeWithStatus(written.status(), payload, group, "checkpoint shard results");
  absl::Status committed = results.status();
  if (save.rank == 0) {
    if (committed.ok()) committed = Commit(save, *results);
    if (!committed.ok()) base::RemoveTree(save.temporary_dir).IgnoreError();
  }
  if (save.world_size > 1 && group != nullptr) {
    KEEL_RETURN_IF_ERROR(base::AgreeOnStatus(save.rank == 0 ? committed : absl::OkStatus(), group,
                                             "checkpoint commit"));
  }
  return committed;
}

// Describes `ref` (saved as "<full>") as a manifest entry with one chunk: its block of the
// global tensor. Errors: kInvalidArgument for an undefined tensor, a layout that does not fit,
// or one with a Partial dimension.
absl::Status DescribeBlock(const std::string& full, const TensorRef& ref, TensorEntry& entry) {
  if (!ref.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", full, "\" is undefined"));
  }
  for (const parallel::LayoutDim& dim :
       ref.layout ? ref.layout->dims : std::vector<parallel::LayoutDim>()) {
    if (dim.placement.kind == parallel::Placement::Kind::kPartial) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", full, "\" is a partial sum over \"", dim.name,
                       "\": reduce it before saving (a checkpoint holds whole tensors)"));
    }
  }
  entry.set_name(full);
  KEEL_ASSIGN_OR_RETURN(std::string dtype, internal::DtypeName(ref.tensor.scalar_type()));
  entry.set_dtype(dtype);
  const std::vector<int64_t> lengths = ref.tensor.sizes().vec();
  const std::vector<int64_t> global = ref.layout ? ref.layout->global_shape : lengths;
  const std::vector<int64_t> offsets =
      ref.layout ? ref.layout->offsets : std::vector<int64_t>(lengths.size(), 0);
  if (global.size() != lengths.size() || offsets.size() != lengths.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", full, "\": layout global_shape ", Dims(global), " and offsets ",
                     Dims(offsets), " must have the tensor's rank (", lengths.size(), ")"));
  }
  for (size_t d = 0; d < lengths.size(); ++d) {
    if (offsets[d] < 0 || offsets[d] + lengths[d] > global[d]) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", full, "\": block at ",
                                                     Dims(offsets), " of shape ", Dims(lengths),
                                                     " does not fit in ", Dims(global)));
    }
  }
  for (int64_t dim : global) entry.add_shape(dim);
  Chunk* chunk = entry.add_chunks();
  for (size_t d = 0; d < lengths.size(); ++d) {
    chunk->add_offsets(offsets[d]);
    chunk->add_lengths(lengths[d]);
  }
  chunk->set_byte_length(ref.tensor.nbytes());
  return absl::OkStatus();
}

// Loads the checkpoint at `path` into `statefuls` as rank `rank` of `world_size`, without
// collectives.
absl::StatusOr<LoadReport> LoadAs(
    const std::string& path, const Statefuls& statefuls, const LoadOptions& options, int rank,
    int world_size, const internal::UnreadOnEveryRank& unread_on_every_rank = nullptr) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<internal::DiskSavedState> saved,
                        internal::DiskSavedState::Open(path, rank, world_size));
  return internal::LoadStatefuls(statefuls, *saved, options, unread_on_every_rank);
}

// The keys no rank of `group` read: every rank's unread keys, intersected; the lowest failing
// rank's status if one failed. Collective: over `group`.
absl::StatusOr<std::vector<std::string>> UnreadOnEveryRank(const absl::Status& status,
                                                           const std::vector<std::string>& unread,
                                                           c10d::ProcessGroup& group) {
  KEEL_ASSIGN_OR_RETURN(
      std::vector<std::string> payloads,
      base::ExchangeWithStatus(status, absl::StrJoin(unread, std::string(1, '\0')), &group,
                               "the checkpoint keys each rank read"));
  std::set<std::string> common(unread.begin(), unread.end());
  for (const std::string& payload : payloads) {
    const std::vector<std::string> keys = absl::StrSplit(payload, '\0', absl::SkipEmpty());
    const std::set<std::string> theirs(keys.begin(), keys.end());
    for (auto it = common.begin(); it != common.end();) {
      it = theirs.count(*it) == 0 ? common.erase(it) : std::next(it);
    }
  }
  return std::vector<std::string>(common.begin(), common.end());
}

// Rank 0: lists every tensor of every rank's plan once (without chunks), sorted by name.
void ListTensors(const std::vector<Manifest>& local_plans, Manifest& manifest) {
  std::set<std::string> listed;
  for (const Manifest& part : local_plans) {
    for (const TensorEntry& tensor : part.tensors()) {
      if (!listed.insert(tensor.name()).second) continue;
      TensorEntry* entry = manifest.add_tensors();
      entry->set_name(tensor.name());
      entry->set_dtype(tensor.dtype());
      *entry->mutable_shape() = tensor.shape();
    }
  }
  std::sort(manifest.mutable_tensors()->begin(), manifest.mutable_tensors()->end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name() < b.name(); });
}

}  // namespace

class Checkpointer::Impl {
 public:
  Impl(const CheckpointerOptions& options, c10d::ProcessGroup* group)
      : options_(options),
        group_(group),
        rank_(base::GroupRank(group)),
        world_size_(base::GroupSize(group)) {}

  ~Impl() {
    if (writer_.joinable()) writer_.join();
  }

  absl::Status Save(const Statefuls& statefuls, int64_t step, int64_t epoch) {
    KEEL_RETURN_IF_ERROR(Wait());
    auto save = NewPendingSave(step);
    std::map<std::string, State> states;
    Manifest local;
    absl::Status prepared = Prepare(statefuls, step, epoch, *save, states, local);
    std::string payload;
    if (prepared.ok()) local.SerializeToString(&payload);
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> plans,
                          base::ExchangeWithStatus(prepared, payload, group_, "checkpoint plans"));
    std::vector<Manifest> local_plans(plans.size());
    for (size_t r = 0; r < plans.size(); ++r) {
      if (!local_plans[r].ParseFromString(plans[r])) {
        return absl::InternalError(absl::StrCat("unparsable checkpoint plan from rank ", r));
      }
    }
    absl::StatusOr<std::vector<std::vector<std::string>>> plan = internal::PlanWrites(local_plans);
    absl::StatusOr<std::vector<ObjectEntry>> objects = internal::PlanValues(local_plans);
    if (const absl::Status planned = plan.ok() ? objects.status() : plan.status(); !planned.ok()) {
      if (rank_ == 0) base::RemoveTree(save->temporary_dir).IgnoreError();
      return base::Annotate(planned, absl::StrCat("saving ", save->final_dir));
    }
    if (rank_ == 0) {
      ListTensors(local_plans, save->manifest);
      for (ObjectEntry& object : *objects) *save->manifest.add_objects() = std::move(object);
      save->manifest.set_format_version(internal::LowestFormatVersion(save->manifest));
    }
    absl::Status staged = Stage(states, local, (*plan)[rank_], *save);
    if (!options_.is_async || !staged.ok()) {
      return Finish(WriteAndCommit(*save, staged, group_), *save);
    }
    in_flight_ = std::move(save);
    writer_ = std::thread(
        [this] { writer_status_ = WriteAndCommit(*in_flight_, absl::OkStatus(), group_); });
    return absl::OkStatus();
  }

  absl::Status Wait() {
    if (!writer_.joinable()) return absl::OkStatus();
    writer_.join();
    std::unique_ptr<PendingSave> save = std::move(in_flight_);
    return Finish(writer_status_, *save);
  }

  absl::StatusOr<LoadReport> Load(const std::string& path, const Statefuls& statefuls,
                                  const LoadOptions& options) {
    internal::UnreadOnEveryRank unread_on_every_rank;
    if (group_ != nullptr) {
      unread_on_every_rank = [this](const absl::Status& status,
                                    const std::vector<std::string>& unread) {
        return UnreadOnEveryRank(status, unread, *group_);
      };
    }
    absl::StatusOr<LoadReport> report =
        LoadAs(path, statefuls, options, rank_, world_size_, unread_on_every_rank);
    KEEL_RETURN_IF_ERROR(base::AgreeOnStatus(report.status(), group_, "checkpoint load"));
    loaded_ = path;
    return report;
  }

  absl::StatusOr<ResumeResult> LoadLatest(const Statefuls& statefuls,
                                          const ResumeOptions& options) {
    ResumeResult result;
    std::string loaded_name;
    while (true) {
      KEEL_ASSIGN_OR_RETURN(const std::string name, AgreeOnNewest());
      if (name.empty()) break;
      const std::string path = base::JoinPath(options_.checkpoint_dir, name);
      absl::StatusOr<CheckpointInfo> info = CheckBeforeLoad(path, options);
      absl::Status status = info.status();
      if (status.ok()) {
        absl::StatusOr<LoadReport> report = Load(path, statefuls, options.load);
        if (report.ok()) {
          loaded_name = name;
          result.loaded = *info;
          result.report = *std::move(report);
          break;
        }
        status = report.status();
      }
      if (!absl::IsDataLoss(status) && !absl::IsNotFound(status)) {
        // A load that failed after objects began to change (an object refusing a value, say)
        // leaves them as reset makes them, as before the search.
        if (info.ok() && options.reset) {
          KEEL_RETURN_IF_ERROR(
              base::AgreeOnStatus(options.reset(), group_, "resetting after a failed load"));
        }
        return status;
      }
      KEEL_ASSIGN_OR_RETURN(const std::string moved, QuarantineAgreed(name));
      result.warnings.push_back(absl::StrCat("checkpoint ", path, " does not load (",
                                             status.message(), "); moved to ", moved));
      result.quarantined.push_back(moved);
      if (!info.ok()) continue;  // found before anything was read
      if (!options.reset) {
        result.partial = true;
        break;
      }
      KEEL_RETURN_IF_ERROR(
          base::AgreeOnStatus(options.reset(), group_, "resetting after a failed load"));
    }
    if (!result.quarantined.empty()) KEEL_RETURN_IF_ERROR(PointLatestAt(loaded_name));
    return result;
  }

  std::optional<std::string> last_saved() const { return last_saved_; }

 private:
  // The newest committed step directory's name as rank 0 lists it ("" when there is none).
  absl::StatusOr<std::string> AgreeOnNewest() {
    absl::StatusOr<std::vector<internal::CommittedStep>> steps =
        rank_ == 0 ? internal::ListCommitted(options_.checkpoint_dir)
                   : std::vector<internal::CommittedStep>();
    const std::string name = steps.ok() && !steps->empty() ? steps->front().name : "";
    KEEL_ASSIGN_OR_RETURN(
        std::vector<std::string> names,
        base::ExchangeWithStatus(steps.status(), name, group_, "the checkpoint to resume from"));
    return names[0];
  }

  // Every rank checks the manifest and file sizes, then runs before_load; the ranks agree.
  absl::StatusOr<CheckpointInfo> CheckBeforeLoad(const std::string& path,
                                                 const ResumeOptions& options) {
    absl::StatusOr<VerifyReport> report = Verify(path, VerifyLevel::kStructure);
    absl::Status status = report.ok() ? report->ToStatus() : report.status();
    if (status.ok() && options.before_load) status = options.before_load(report->checkpoint);
    KEEL_RETURN_IF_ERROR(base::AgreeOnStatus(status, group_, "checking the checkpoint"));
    return report->checkpoint;
  }

  // Rank 0 moves step directory `name` to the quarantine; every rank learns where to.
  absl::StatusOr<std::string> QuarantineAgreed(const std::string& name) {
    absl::StatusOr<std::string> moved =
        rank_ == 0 ? internal::Quarantine(options_.checkpoint_dir, name) : std::string();
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> paths,
                          base::ExchangeWithStatus(moved.status(), moved.value_or(""), group_,
                                                   "quarantining a checkpoint"));
    return paths[0];
  }

  // Rank 0 points "latest" at step directory `name`, or removes it for "".
  absl::Status PointLatestAt(const std::string& name) {
    absl::Status status;
    if (rank_ == 0) {
      const std::string latest = base::JoinPath(options_.checkpoint_dir, internal::kLatestName);
      status = name.empty() ? base::RemoveTree(latest)
                            : base::WriteFileAtomically(latest, absl::StrCat(name, "\n"));
    }
    return base::AgreeOnStatus(status, group_, "updating latest");
  }

  std::unique_ptr<PendingSave> NewPendingSave(int64_t step) const {
    auto save = std::make_unique<PendingSave>();
    save->checkpoint_dir = options_.checkpoint_dir;
    save->name = internal::StepDirName(step);
    save->final_dir = base::JoinPath(options_.checkpoint_dir, save->name);
    save->temporary_dir =
        base::JoinPath(options_.checkpoint_dir, internal::TemporaryDirName(save->name));
    save->rank = rank_;
    save->world_size = world_size_;
    save->format = options_.model_save_format;
    return save;
  }

  // Step 1 before the exchange: collects the states, describes this rank's blocks and values
  // and (rank 0) starts the manifest and makes the temporary directory. The exchange's
  // agreement covers its failures.
  absl::Status Prepare(const Statefuls& statefuls, int64_t step, int64_t epoch, PendingSave& save,
                       std::map<std::string, State>& states, Manifest& local) {
    if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step (", step, ") must be >= 0"));
    for (const auto& [name, stateful] : statefuls) {
      if (name.empty() || name.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("stateful name \"", name, "\" must be non-empty and contain no '/'"));
      }
      absl::StatusOr<State> state = stateful->StateDict();
      KEEL_RETURN_IF_ERROR(base::Annotate(state.status(), absl::StrCat("state of ", name)));
      for (const auto& [key, ref] : state->tensors) {
        KEEL_RETURN_IF_ERROR(
            DescribeBlock(absl::StrCat(name, "/", key), ref, *local.add_tensors()));
      }
      ObjectEntry* object = local.add_objects();
      object->set_name(name);
      internal::JsonToValue(state->values, *object->mutable_value());
      states[name] = *std::move(state);
    }
    if (rank_ != 0) return absl::OkStatus();
    Manifest& manifest = save.manifest;
    manifest.set_keel_version(internal::kKeelVersion);
    manifest.set_step(step);
    manifest.set_epoch(epoch);
    manifest.set_world_size(world_size_);
    manifest.set_shard_format(save.format == SerializationFormat::kKeel ? ShardFormat::KEEL
                                                                        : ShardFormat::SAFETENSORS);
    KEEL_RETURN_IF_ERROR(base::MakeDirectories(options_.checkpoint_dir));
    if (base::PathExists(save.final_dir)) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", save.final_dir, " already exists; not overwriting it"));
    }
    KEEL_RETURN_IF_ERROR(base::RemoveTree(save.temporary_dir));
    return base::MakeDirectories(save.temporary_dir);
  }

  // Gives each block this rank writes contiguous host bytes: the live tensor when saving
  // synchronously from a contiguous CPU tensor, else a copy (into reused buffers, pinned for
  // CUDA tensors, when saving asynchronously).
  absl::Status Stage(std::map<std::string, State>& states, const Manifest& local,
                     const std::vector<std::string>& names, PendingSave& save) {
    std::map<std::string, const TensorEntry*> entries;
    for (const TensorEntry& entry : local.tensors()) entries[entry.name()] = &entry;
    if (staging_.size() < names.size()) staging_.resize(names.size());
    // The CUDA devices whose copies are still running when Save returns (asynchronous only).
    std::set<c10::DeviceIndex> devices;
    return base::CallTorch(absl::StatusCode::kInternal, "staging tensors", [&] {
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string& full = names[i];
        const size_t slash = full.find('/');
        const at::Tensor source =
            states.at(full.substr(0, slash)).tensors.at(full.substr(slash + 1)).tensor.detach();
        save.items.push_back({StagedBytes(source, staging_[i]), *entries.at(full)});
        if (options_.is_async && source.is_cuda()) devices.insert(source.device().index());
      }
      // An event after the copies on each device's stream: the writer thread waits for it.
      // (Later kernels on the stream run after the copies, so the weights may change as soon
      // as Save returns.)
      for (c10::DeviceIndex index : devices) {
        save.copies_done.push_back(base::RecordCudaFence(at::Device(at::kCUDA, index)));
      }
    });
  }

  // The host bytes of `source` to write: itself, a contiguous CPU copy, or (async) a copy into
  // `buffer`, reused across saves. May throw c10::Error.
  at::Tensor StagedBytes(const at::Tensor& source, at::Tensor& buffer) const {
    if (!options_.is_async) {
      return source.device().is_cpu() && source.is_contiguous() ? source
                                                                : source.contiguous().cpu();
    }
    const int64_t nbytes = static_cast<int64_t>(source.nbytes());
    if (!buffer.defined() || buffer.numel() != nbytes || buffer.is_pinned() != source.is_cuda()) {
      buffer =
          at::empty({nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(source.is_cuda()));
    }
    at::Tensor bytes = buffer.view(source.scalar_type()).view(source.sizes());
    bytes.copy_(source, /*non_blocking=*/source.is_cuda());
    return bytes;
  }

  absl::Status Finish(const absl::Status& status, const PendingSave& save) {
    KEEL_RETURN_IF_ERROR(base::Annotate(status, absl::StrCat("saving ", save.final_dir)));
    last_saved_ = save.final_dir;
    if (rank_ != 0 || (options_.keep_last_k == 0 && options_.keep_every_n_steps == 0)) {
      return absl::OkStatus();
    }
    std::vector<std::string> keep = {save.final_dir};
    if (loaded_) keep.push_back(*loaded_);
    return base::Annotate(ApplyRetention(options_.checkpoint_dir, options_, keep),
                          absl::StrCat("saved ", save.final_dir, ", but retention failed"));
  }

  const CheckpointerOptions options_;
  c10d::ProcessGroup* const group_;
  const int rank_;
  const int world_size_;
  std::vector<at::Tensor> staging_;
  std::thread writer_;
  std::unique_ptr<PendingSave> in_flight_;
  absl::Status writer_status_;
  std::optional<std::string> loaded_;
  std::optional<std::string> last_saved_;
};

absl::Status CheckCheckpointerOptions(const CheckpointerOptions& options) {
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("checkpoint_dir must be set");
  }
  if (options.keep_last_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last_k (", options.keep_last_k, ") must be >= 0 (0 keeps all)"));
  }
  if (options.keep_every_n_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keep_every_n_steps (", options.keep_every_n_steps, ") must be >= 0 (0: none)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(
    const CheckpointerOptions& options, c10d::ProcessGroup* group) {
  KEEL_RETURN_IF_ERROR(CheckCheckpointerOptions(options));
  KEEL_RETURN_IF_ERROR(base::CheckGroupCarries(group, at::kCPU, "the checkpointer's exchanges"));
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::make_unique<Impl>(options, group)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

absl::Status Checkpointer::Save(const Statefuls& statefuls, int64_t step, int64_t epoch) {
  return impl_->Save(statefuls, step, epoch);
}

absl::Status Checkpointer::Wait() { return impl_->Wait(); }

absl::StatusOr<LoadReport> Checkpointer::Load(const std::string& path, const Statefuls& statefuls,
                                              const LoadOptions& options) {
  return impl_->Load(path, statefuls, options);
}

absl::StatusOr<ResumeResult> Checkpointer::LoadLatest(const Statefuls& statefuls,
                                                      const ResumeOptions& options) {
  return impl_->LoadLatest(statefuls, options);
}

std::optional<std::string> Checkpointer::last_saved() const { return impl_->last_saved(); }

absl::StatusOr<LoadReport> LoadCheckpoint(const std::string& path, const Statefuls& statefuls,
                                          const LoadOptions& options) {
  return LoadAs(path, statefuls, options, /*rank=*/0, /*world_size=*/1);
}

}  // namespace keel::checkpoint
