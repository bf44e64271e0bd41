#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/collectives.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/files.h"
#include "checkpoint/internal/manifest_io.h"
#include "checkpoint/internal/plan.h"
#include "checkpoint/internal/saved_state.h"
#include "checkpoint/safetensors.h"
#include "torch/csrc/distributed/c10d/ProcessGroup.hpp"

namespace keel::checkpoint {
namespace {

using internal::JoinPath;

constexpr uint64_t kKeelAlignment = 4096;
constexpr char kStepPrefix[] = "step_";
constexpr char kLatestName[] = "latest";
constexpr char kDeletingPrefix[] = ".deleting.";

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%010lld", static_cast<long long>(step));
  return name;
}

// The step of a committed checkpoint directory name ("step_0000000100"), if it is one.
std::optional<int64_t> StepOfDirName(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return std::nullopt;
  const std::string digits = name.substr(sizeof(kStepPrefix) - 1);
  int64_t step = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(digits, &step)) {
    return std::nullopt;
  }
  return step;
}

// Whether two paths name the same existing file or directory.
bool SamePath(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

std::string Dims(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// ---------------------------------------------------------------------------------------------
// Reading.

struct ChunkLocation {
  uint32_t file = 0;
  uint64_t byte_offset = 0;
  uint64_t byte_length = 0;
  uint64_t xxh3 = 0;
  std::vector<int64_t> offsets;
};

// A checkpoint directory as a SavedState: chunks are read with pread and checked against
// their checksums.
class DiskSavedState : public internal::SavedState {
 public:
  static absl::StatusOr<std::unique_ptr<DiskSavedState>> Open(const std::string& path) {
    KEEL_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
    auto state = std::unique_ptr<DiskSavedState>(new DiskSavedState(path, std::move(manifest)));
    KEEL_RETURN_IF_ERROR(state->Index());
    return state;
  }

  ~DiskSavedState() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  const Manifest& manifest() const { return manifest_; }

  absl::Status ReadChunk(const std::string& key, const internal::SavedChunk& chunk,
                         void* out) const override {
    const ChunkLocation& location = locations_[chunk.source_index];
    const FileEntry& file = manifest_.files(location.file);
    const std::string file_path = JoinPath(path_, file.name());
    KEEL_ASSIGN_OR_RETURN(int fd, FileDescriptor(location.file, key));
    absl::StatusOr<uint64_t> actual =
        internal::PreadChunk(fd, file_path, out, location.byte_length, location.byte_offset);
    if (!actual.ok()) {
      return absl::Status(actual.status().code(),
                          absl::StrCat("tensor \"", key, "\": ", actual.status().message()));
    }
    if (*actual != location.xxh3) {
      return absl::DataLossError(absl::StrCat(file_path, ": tensor \"", key, "\" chunk at offsets ",
                                              Dims(location.offsets), " fails its checksum (xxh3 ",
                                              *actual, ", manifest says ", location.xxh3, ")"));
    }
    return absl::OkStatus();
  }

 private:
  DiskSavedState(std::string path, Manifest manifest)
      : path_(std::move(path)), manifest_(std::move(manifest)), fds_(manifest_.files_size(), -1) {}

  absl::Status Index() {
    for (const TensorEntry& entry : manifest_.tensors()) {
      internal::SavedTensor& tensor = tensors_[entry.name()];
      KEEL_ASSIGN_OR_RETURN(tensor.info.dtype, internal::ParseDtype(entry.dtype()));
      tensor.info.shape.assign(entry.shape().begin(), entry.shape().end());
      for (const Chunk& chunk : entry.chunks()) {
        internal::SavedChunk saved;
        saved.offsets.assign(chunk.offsets().begin(), chunk.offsets().end());
        saved.lengths.assign(chunk.lengths().begin(), chunk.lengths().end());
        saved.source_index = static_cast<int64_t>(locations_.size());
        locations_.push_back(
            {chunk.file(), chunk.byte_offset(), chunk.byte_length(), chunk.xxh3(), saved.offsets});
        tensor.chunks.push_back(std::move(saved));
      }
    }
    for (const ObjectEntry& object : manifest_.objects()) {
      auto values = internal::ValueToJson(object.value());
      if (!values.ok()) {
        return absl::DataLossError(
            absl::StrCat(path_, ": object \"", object.name(), "\": ", values.status().message()));
      }
      values_[object.name()] = *std::move(values);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> FileDescriptor(uint32_t file, const std::string& key) const {
    std::lock_guard<std::mutex> lock(fds_mutex_);
    if (fds_[file] < 0) {
      const std::string file_path = JoinPath(path_, manifest_.files(file).name());
      const int fd = ::open(file_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        absl::Status status = internal::ErrnoError("opening", file_path);
        return absl::DataLossError(
            absl::StrCat("shard file of tensor \"", key, "\" unreadable: ", status.message()));
      }
      fds_[file] = fd;
    }
    return fds_[file];
  }

  std::string path_;
  Manifest manifest_;
  std::vector<ChunkLocation> locations_;
  mutable std::mutex fds_mutex_;
  mutable std::vector<int> fds_;
};

// ---------------------------------------------------------------------------------------------
// Agreement across ranks: every exchange carries each rank's status with its payload, so a
// failure on one rank fails every rank instead of leaving peers waiting.

std::string Frame(const absl::Status& status, const std::string& payload) {
  std::string frame(1, static_cast<char>(status.code()));
  frame += status.ok() ? payload : std::string(status.message());
  return frame;
}

absl::StatusOr<std::vector<std::string>> Exchange(const absl::Status& status,
                                                  const std::string& payload,
                                                  c10d::ProcessGroup* group,
                                                  absl::string_view what) {
  std::vector<std::string> frames;
  if (group == nullptr) {
    frames.push_back(Frame(status, payload));
  } else {
    KEEL_ASSIGN_OR_RETURN(frames, base::AllGatherBytes(Frame(status, payload), *group, what));
  }
  std::vector<std::string> payloads;
  for (size_t rank = 0; rank < frames.size(); ++rank) {
    const auto code = frames[rank].empty() ? absl::StatusCode::kInternal
                                           : static_cast<absl::StatusCode>(frames[rank][0]);
    if (code != absl::StatusCode::kOk) {
      const std::string message = frames[rank].substr(1);
      return absl::Status(
          code, frames.size() == 1 ? message : absl::StrCat("rank ", rank, ": ", message));
    }
    payloads.push_back(frames[rank].substr(1));
  }
  return payloads;
}

// ---------------------------------------------------------------------------------------------
// Writing.

// A block this rank writes: its bytes (host, contiguous) and its manifest entry (one chunk).
struct WriteItem {
  at::Tensor bytes;
  TensorEntry entry;
};

// Everything the write-and-commit phase needs; owned by the background thread when async.
struct PendingSave {
  std::string checkpoint_dir;
  // "step_<step>", and its temporary and final paths.
  std::string name;
  std::string temporary_dir;
  std::string final_dir;
  int rank = 0;
  int world_size = 1;
  SerializationFormat format = SerializationFormat::kKeel;
  std::vector<WriteItem> items;
  // Rank 0: the manifest without files and chunk placement.
  Manifest manifest;
};

// Writes this rank's shard file; returns the file and its chunks as a partial manifest.
absl::StatusOr<Manifest> WriteShard(const PendingSave& save) {
  Manifest written;
  if (save.items.empty()) return written;
  const bool keel = save.format == SerializationFormat::kKeel;
  const std::string name = absl::StrCat("__", save.rank, keel ? ".keel" : ".safetensors");
  KEEL_ASSIGN_OR_RETURN(internal::OutputFile file,
                        internal::OutputFile::Create(JoinPath(save.temporary_dir, name)));
  std::vector<uint64_t> offsets;
  if (!keel) {
    std::vector<SafetensorsEntry> entries;
    base::Json sharding = base::Json::object();
    for (const WriteItem& item : save.items) {
      SafetensorsEntry entry;
      entry.name = item.entry.name();
      entry.dtype = item.bytes.scalar_type();
      entry.shape.assign(item.entry.chunks(0).lengths().begin(),
                         item.entry.chunks(0).lengths().end());
      entries.push_back(std::move(entry));
      sharding[item.entry.name()]["saved_offsets"] = std::vector<int64_t>(
          item.entry.chunks(0).offsets().begin(), item.entry.chunks(0).offsets().end());
    }
    KEEL_ASSIGN_OR_RETURN(
        std::string header,
        EncodeSafetensorsHeader(entries,
                                {{"format", "pt"}, {"keel_sharding_info", sharding.dump()}}));
    KEEL_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
    for (const SafetensorsEntry& entry : entries) offsets.push_back(header.size() + entry.begin);
  }
  for (size_t i = 0; i < save.items.size(); ++i) {
    const WriteItem& item = save.items[i];
    if (keel) {
      KEEL_RETURN_IF_ERROR(file.PadTo(kKeelAlignment));
      offsets.push_back(file.size());
    }
    TensorEntry* entry = written.add_tensors();
    *entry = item.entry;
    Chunk* chunk = entry->mutable_chunks(0);
    chunk->set_file(0);
    chunk->set_byte_offset(offsets[i]);
    absl::StatusOr<uint64_t> checksum = file.WriteChunk(item.bytes.data_ptr(), item.bytes.nbytes());
    if (!checksum.ok()) {
      return absl::Status(
          checksum.status().code(),
          absl::StrCat(checksum.status().message(), " (tensor \"", item.entry.name(), "\")"));
    }
    chunk->set_xxh3(*checksum);
  }
  KEEL_RETURN_IF_ERROR(file.Close());
  FileEntry* entry = written.add_files();
  entry->set_name(name);
  entry->set_size(file.size());
  entry->set_xxh3(file.checksum());
  entry->set_rank(save.rank);
  return written;
}

// Rank 0: merges every rank's written files and chunks into the manifest and commits.
absl::Status Commit(PendingSave& save, const std::vector<std::string>& written) {
  Manifest& manifest = save.manifest;
  std::map<std::string, TensorEntry*> tensors;
  for (TensorEntry& tensor : *manifest.mutable_tensors()) tensors[tensor.name()] = &tensor;
  for (const std::string& bytes : written) {
    Manifest part;
    if (!part.ParseFromString(bytes)) return absl::InternalError("unparsable shard result");
    const uint32_t base = static_cast<uint32_t>(manifest.files_size());
    for (const FileEntry& file : part.files()) *manifest.add_files() = file;
    for (const TensorEntry& tensor : part.tensors()) {
      Chunk* chunk = tensors.at(tensor.name())->add_chunks();
      *chunk = tensor.chunks(0);
      chunk->set_file(base + chunk->file());
    }
  }
  for (TensorEntry& tensor : *manifest.mutable_tensors()) {
    std::sort(tensor.mutable_chunks()->begin(), tensor.mutable_chunks()->end(),
              [](const Chunk& a, const Chunk& b) {
                return std::lexicographical_compare(a.offsets().begin(), a.offsets().end(),
                                                    b.offsets().begin(), b.offsets().end());
              });
  }
  KEEL_RETURN_IF_ERROR(internal::WriteFileAtomically(
      JoinPath(save.temporary_dir, internal::kManifestName), internal::EncodeManifest(manifest)));
  KEEL_RETURN_IF_ERROR(internal::RenameDurably(save.temporary_dir, save.final_dir));
  return internal::WriteFileAtomically(JoinPath(save.checkpoint_dir, kLatestName),
                                       absl::StrCat(save.name, "\n"));
}

// The write-and-commit phase, run by every rank (inline or on the background thread). A rank
// whose staging failed writes nothing and reports `staged`, which fails the save everywhere.
absl::Status WriteAndCommit(PendingSave& save, const absl::Status& staged,
                            c10d::ProcessGroup* group) {
  absl::StatusOr<Manifest> written = staged.ok() ? WriteShard(save) : staged;
  std::string payload;
  if (written.ok()) written->SerializeToString(&payload);
  absl::StatusOr<std::vector<std::string>> results =
      Exchange(written.status(), payload, group, "checkpoint shard results");
  absl::Status committed = results.status();
  if (save.rank == 0) {
    if (committed.ok()) committed = Commit(save, *results);
    if (!committed.ok()) internal::RemoveTree(save.temporary_dir).IgnoreError();
  }
  if (save.world_size > 1 && group != nullptr) {
    KEEL_RETURN_IF_ERROR(
        Exchange(save.rank == 0 ? committed : absl::OkStatus(), "", group, "checkpoint commit")
            .status());
  }
  return committed;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

class Checkpointer::Impl {
 public:
  Impl(const CheckpointerOptions& options, c10d::ProcessGroup* group)
      : options_(options),
        group_(group),
        rank_(group == nullptr ? 0 : group->getRank()),
        world_size_(group == nullptr ? 1 : group->getSize()) {}

  ~Impl() {
    if (writer_.joinable()) writer_.join();
  }

  absl::Status Save(const Statefuls& statefuls, int64_t step, int64_t epoch) {
    KEEL_RETURN_IF_ERROR(Wait());
    auto save = std::make_unique<PendingSave>();
    save->checkpoint_dir = options_.checkpoint_dir;
    save->name = StepDirName(step);
    save->final_dir = JoinPath(options_.checkpoint_dir, save->name);
    save->temporary_dir = JoinPath(options_.checkpoint_dir, absl::StrCat(".", save->name, ".tmp"));
    save->rank = rank_;
    save->world_size = world_size_;
    save->format = options_.model_save_format;

    std::map<std::string, State> states;
    Manifest local;
    absl::Status prepared = Prepare(statefuls, step, epoch, *save, states, local);
    std::string payload;
    if (prepared.ok()) local.SerializeToString(&payload);
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> plans,
                          Exchange(prepared, payload, group_, "checkpoint plans"));
    std::vector<Manifest> local_plans(plans.size());
    for (size_t r = 0; r < plans.size(); ++r) {
      if (!local_plans[r].ParseFromString(plans[r])) {
        return absl::InternalError(absl::StrCat("unparsable checkpoint plan from rank ", r));
      }
    }
    absl::StatusOr<std::vector<std::vector<std::string>>> plan = internal::PlanWrites(local_plans);
    if (!plan.ok()) {
      if (rank_ == 0) internal::RemoveTree(save->temporary_dir).IgnoreError();
      return absl::Status(plan.status().code(),
                          absl::StrCat("saving ", save->final_dir, ": ", plan.status().message()));
    }
    if (rank_ == 0) {
      for (const Manifest& part : local_plans) {
        for (const TensorEntry& tensor : part.tensors()) {
          if (std::none_of(save->manifest.tensors().begin(), save->manifest.tensors().end(),
                           [&](const TensorEntry& t) { return t.name() == tensor.name(); })) {
            TensorEntry* entry = save->manifest.add_tensors();
            entry->set_name(tensor.name());
            entry->set_dtype(tensor.dtype());
            *entry->mutable_shape() = tensor.shape();
          }
        }
      }
      std::sort(save->manifest.mutable_tensors()->begin(), save->manifest.mutable_tensors()->end(),
                [](const TensorEntry& a, const TensorEntry& b) { return a.name() < b.name(); });
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
    absl::StatusOr<LoadReport> report = LoadCheckpoint(path, statefuls, options);
    KEEL_RETURN_IF_ERROR(Exchange(report.status(), "", group_, "checkpoint load").status());
    loaded_ = path;
    return report;
  }

  std::optional<std::string> last_saved() const { return last_saved_; }

 private:
  // Collects the states, describes this rank's blocks, and (rank 0) makes the temporary
  // directory. Runs before the first exchange, whose agreement covers its failures.
  absl::Status Prepare(const Statefuls& statefuls, int64_t step, int64_t epoch, PendingSave& save,
                       std::map<std::string, State>& states, Manifest& local) {
    if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step (", step, ") must be >= 0"));
    for (const auto& [name, stateful] : statefuls) {
      if (name.empty() || name.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("stateful name \"", name, "\" must be non-empty and contain no '/'"));
      }
      absl::StatusOr<State> state = stateful->StateDict();
      if (!state.ok()) {
        return absl::Status(state.status().code(),
                            absl::StrCat("state of ", name, ": ", state.status().message()));
      }
      for (const auto& [key, ref] : state->tensors) {
        const std::string full = absl::StrCat(name, "/", key);
        if (!ref.tensor.defined()) {
          return absl::InvalidArgumentError(absl::StrCat("tensor \"", full, "\" is undefined"));
        }
        TensorEntry* entry = local.add_tensors();
        entry->set_name(full);
        KEEL_ASSIGN_OR_RETURN(std::string dtype, internal::DtypeName(ref.tensor.scalar_type()));
        entry->set_dtype(dtype);
        const std::vector<int64_t> lengths = ref.tensor.sizes().vec();
        const std::vector<int64_t> global = ref.placement ? ref.placement->global_shape : lengths;
        const std::vector<int64_t> offsets =
            ref.placement ? ref.placement->offsets : std::vector<int64_t>(lengths.size(), 0);
        if (global.size() != lengths.size() || offsets.size() != lengths.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor \"", full, "\": placement global_shape ", Dims(global), " and offsets ",
              Dims(offsets), " must have the tensor's rank (", lengths.size(), ")"));
        }
        for (size_t d = 0; d < lengths.size(); ++d) {
          if (offsets[d] < 0 || offsets[d] + lengths[d] > global[d]) {
            return absl::InvalidArgumentError(
                absl::StrCat("tensor \"", full, "\": block at ", Dims(offsets), " of shape ",
                             Dims(lengths), " does not fit in ", Dims(global)));
          }
        }
        for (int64_t dim : global) entry->add_shape(dim);
        Chunk* chunk = entry->add_chunks();
        for (size_t d = 0; d < lengths.size(); ++d) {
          chunk->add_offsets(offsets[d]);
          chunk->add_lengths(lengths[d]);
        }
        chunk->set_byte_length(ref.tensor.nbytes());
      }
      states[name] = *std::move(state);
    }
    if (rank_ == 0) {
      Manifest& manifest = save.manifest;
      manifest.set_format_version(internal::kFormatVersion);
      manifest.set_keel_version(internal::kKeelVersion);
      manifest.set_step(step);
      manifest.set_epoch(epoch);
      manifest.set_world_size(world_size_);
      manifest.set_shard_format(
          save.format == SerializationFormat::kKeel ? ShardFormat::KEEL : ShardFormat::SAFETENSORS);
      for (const auto& [name, state] : states) {
        ObjectEntry* object = manifest.add_objects();
        object->set_name(name);
        internal::JsonToValue(state.values, *object->mutable_value());
      }
      KEEL_RETURN_IF_ERROR(MakeDirectories(options_.checkpoint_dir));
      if (internal::PathExists(save.final_dir)) {
        return absl::AlreadyExistsError(
            absl::StrCat("checkpoint ", save.final_dir, " already exists; not overwriting it"));
      }
      KEEL_RETURN_IF_ERROR(internal::RemoveTree(save.temporary_dir));
      KEEL_RETURN_IF_ERROR(internal::MakeDirectory(save.temporary_dir));
    }
    return absl::OkStatus();
  }

  // Gives each block this rank writes contiguous host bytes: the live tensor when saving
  // synchronously from a contiguous CPU tensor, else a copy (into reused buffers, pinned for
  // CUDA tensors, when saving asynchronously).
  absl::Status Stage(std::map<std::string, State>& states, const Manifest& local,
                     const std::vector<std::string>& names, PendingSave& save) {
    std::map<std::string, const TensorEntry*> entries;
    for (const TensorEntry& entry : local.tensors()) entries[entry.name()] = &entry;
    if (staging_.size() < names.size()) staging_.resize(names.size());
    bool any_cuda = false;
    KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "staging tensors", [&] {
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string& full = names[i];
        const size_t slash = full.find('/');
        const at::Tensor& tensor =
            states.at(full.substr(0, slash)).tensors.at(full.substr(slash + 1)).tensor;
        const at::Tensor source = tensor.detach();
        at::Tensor bytes;
        if (!options_.is_async && source.device().is_cpu() && source.is_contiguous()) {
          bytes = source;
        } else if (!options_.is_async) {
          bytes = source.contiguous().cpu();
        } else {
          const int64_t nbytes = static_cast<int64_t>(source.nbytes());
          at::Tensor& buffer = staging_[i];
          if (!buffer.defined() || buffer.numel() != nbytes ||
              buffer.is_pinned() != source.is_cuda()) {
            buffer = at::empty(
                {nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(source.is_cuda()));
          }
          bytes = buffer.view(source.scalar_type()).view(source.sizes());
          bytes.copy_(source, /*non_blocking=*/source.is_cuda());
          any_cuda = any_cuda || source.is_cuda();
        }
        save.items.push_back({bytes, *entries.at(full)});
      }
    }));
    if (any_cuda) {
      KEEL_RETURN_IF_ERROR(base::CallTorch(absl::StatusCode::kInternal, "synchronizing copies",
                                           [&] { at::empty({0}, at::kCUDA).cpu(); }));
    }
    return absl::OkStatus();
  }

  absl::Status Finish(const absl::Status& status, const PendingSave& save) {
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("saving ", save.final_dir, ": ", status.message()));
    }
    last_saved_ = save.final_dir;
    if (rank_ == 0 && (options_.keep_last_k > 0 || options_.keep_every_n_steps > 0)) {
      std::vector<std::string> keep = {save.final_dir};
      if (loaded_) keep.push_back(*loaded_);
      absl::Status retained = ApplyRetention(options_.checkpoint_dir, options_, keep);
      if (!retained.ok()) {
        return absl::Status(
            retained.code(),
            absl::StrCat("saved ", save.final_dir, ", but retention failed: ", retained.message()));
      }
    }
    return absl::OkStatus();
  }

  static absl::Status MakeDirectories(const std::string& path) {
    if (path.empty() || internal::PathExists(path)) return absl::OkStatus();
    KEEL_RETURN_IF_ERROR(MakeDirectories(internal::ParentDirectory(path)));
    return internal::MakeDirectory(path);
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

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(
    const CheckpointerOptions& options, c10d::ProcessGroup* group) {
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

std::optional<std::string> Checkpointer::last_saved() const { return impl_->last_saved(); }

// ---------------------------------------------------------------------------------------------

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  const std::string manifest_path = JoinPath(path, internal::kManifestName);
  absl::StatusOr<std::string> bytes = internal::ReadWholeFile(manifest_path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint at ", path, ": ", bytes.status().message()));
  }
  KEEL_RETURN_IF_ERROR(bytes.status());
  return internal::DecodeManifest(*bytes, manifest_path);
}

absl::StatusOr<LoadReport> LoadCheckpoint(const std::string& path, const Statefuls& statefuls,
                                          const LoadOptions& options) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<DiskSavedState> saved, DiskSavedState::Open(path));
  return internal::LoadStatefuls(statefuls, *saved, options);
}

namespace {

// Re-reads shard file `f` once: each chunk's checksum (a problem naming the tensor when it
// differs), then the file checksum over the rest. Errors: only failures to read.
absl::Status VerifyFileBytes(const Manifest& manifest, int f, const std::string& file_path,
                             std::vector<std::string>& problems) {
  struct Region {
    const TensorEntry* tensor;
    const Chunk* chunk;
  };
  std::vector<Region> regions;
  for (const TensorEntry& tensor : manifest.tensors()) {
    for (const Chunk& chunk : tensor.chunks()) {
      if (chunk.file() == static_cast<uint32_t>(f)) regions.push_back({&tensor, &chunk});
    }
  }
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) {
    return a.chunk->byte_offset() < b.chunk->byte_offset();
  });
  const int fd = ::open(file_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return internal::ErrnoError("opening", file_path);
  std::string buffer(size_t{1} << 20, '\0');
  internal::Hasher summary;
  uint64_t position = 0;
  // Feeds [position, end) to `sink` block by block.
  auto feed = [&](uint64_t end, auto&& sink) -> absl::Status {
    while (position < end) {
      const size_t length = static_cast<size_t>(std::min<uint64_t>(end - position, buffer.size()));
      KEEL_RETURN_IF_ERROR(internal::PreadAll(fd, file_path, buffer.data(), length, position));
      sink(buffer.data(), length);
      position += length;
    }
    return absl::OkStatus();
  };
  auto raw = [&](const char* data, size_t length) { summary.Update(data, length); };
  const size_t before = problems.size();
  absl::Status status;
  for (const Region& region : regions) {
    if (region.chunk->byte_offset() < position) {
      problems.push_back(absl::StrCat(file_path, ": chunks of \"", region.tensor->name(),
                                      "\" overlap others in the file"));
      break;
    }
    status = feed(region.chunk->byte_offset(), raw);
    if (!status.ok()) break;
    internal::SegmentHasher chunk;
    status = feed(region.chunk->byte_offset() + region.chunk->byte_length(),
                  [&](const char* data, size_t length) { chunk.Update(data, length); });
    if (!status.ok()) break;
    const uint64_t digest = chunk.Digest();
    if (digest != region.chunk->xxh3()) {
      problems.push_back(absl::StrCat(
          file_path, ": tensor \"", region.tensor->name(), "\" chunk at offsets ",
          Dims({region.chunk->offsets().begin(), region.chunk->offsets().end()}),
          " fails its checksum (xxh3 ", digest, ", manifest says ", region.chunk->xxh3(), ")"));
    }
    char bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((digest >> (8 * i)) & 0xff);
    summary.Update(bytes, sizeof(bytes));
  }
  if (status.ok()) status = feed(manifest.files(f).size(), raw);
  ::close(fd);
  KEEL_RETURN_IF_ERROR(status);
  if (problems.size() == before && summary.Digest() != manifest.files(f).xxh3()) {
    problems.push_back(absl::StrCat(file_path, ": fails its checksum outside tensor data (xxh3 ",
                                    summary.Digest(), ", manifest says ", manifest.files(f).xxh3(),
                                    ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const std::string& path, VerifyLevel level) {
  KEEL_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
  std::vector<std::string> problems;
  for (int f = 0; f < manifest.files_size(); ++f) {
    const FileEntry& file = manifest.files(f);
    const std::string file_path = JoinPath(path, file.name());
    struct stat st;
    if (::stat(file_path.c_str(), &st) != 0) {
      problems.push_back(absl::StrCat(file_path, ": missing (",
                                      internal::ErrnoError("stat of", file_path).message(), ")"));
      continue;
    }
    if (static_cast<uint64_t>(st.st_size) != file.size()) {
      problems.push_back(
          absl::StrCat(file_path, ": ", st.st_size, " bytes, the manifest says ", file.size()));
      continue;
    }
    if (level != VerifyLevel::kChecksums) continue;
    KEEL_RETURN_IF_ERROR(VerifyFileBytes(manifest, f, file_path, problems));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrJoin(problems, "\n"));
}

absl::StatusOr<FindResult> FindLatest(const std::string& checkpoint_dir, VerifyLevel level) {
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, internal::ListDirectory(checkpoint_dir));
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : names) {
    if (std::optional<int64_t> step = StepOfDirName(name)) steps.emplace_back(*step, name);
  }
  std::sort(steps.rbegin(), steps.rend());
  FindResult result;
  for (const auto& [step, name] : steps) {
    const std::string path = JoinPath(checkpoint_dir, name);
    absl::Status verified = Verify(path, level);
    absl::StatusOr<Manifest> manifest =
        verified.ok() ? ReadManifest(path) : absl::StatusOr<Manifest>(verified);
    if (!manifest.ok()) {
      result.warnings.push_back(absl::StrCat("skipping ", path, ": ", manifest.status().message()));
      continue;
    }
    result.latest = CheckpointInfo{path, manifest->step(), manifest->epoch()};
    break;
  }
  return result;
}

absl::Status ApplyRetention(const std::string& checkpoint_dir, const CheckpointerOptions& options,
                            const std::vector<std::string>& keep) {
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, internal::ListDirectory(checkpoint_dir));
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& name : names) {
    if (std::optional<int64_t> step = StepOfDirName(name)) {
      steps.emplace_back(*step, name);
    } else if (absl::StartsWith(name, kDeletingPrefix) ||
               (absl::StartsWith(name, ".step_") && absl::EndsWith(name, ".tmp"))) {
      KEEL_RETURN_IF_ERROR(internal::RemoveTree(JoinPath(checkpoint_dir, name)));
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  KEEL_ASSIGN_OR_RETURN(FindResult newest, FindLatest(checkpoint_dir));
  auto kept = [&](size_t index, int64_t step, const std::string& path) {
    if (options.keep_last_k == 0 || static_cast<int64_t>(index) < options.keep_last_k) return true;
    if (options.keep_every_n_steps > 0 && step % options.keep_every_n_steps == 0) return true;
    if (newest.latest && newest.latest->path == path) return true;
    return std::any_of(keep.begin(), keep.end(),
                       [&](const std::string& k) { return SamePath(k, path); });
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string path = JoinPath(checkpoint_dir, steps[i].second);
    if (kept(i, steps[i].first, path)) continue;
    const std::string doomed =
        JoinPath(checkpoint_dir, absl::StrCat(kDeletingPrefix, steps[i].second));
    KEEL_RETURN_IF_ERROR(internal::RenameDurably(path, doomed));
    KEEL_RETURN_IF_ERROR(internal::RemoveTree(doomed));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

class CheckpointReader::Impl {
 public:
  explicit Impl(std::unique_ptr<DiskSavedState> saved) : saved_(std::move(saved)) {}
  std::unique_ptr<DiskSavedState> saved_;
};

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<DiskSavedState> saved, DiskSavedState::Open(path));
  return std::unique_ptr<CheckpointReader>(
      new CheckpointReader(std::make_unique<Impl>(std::move(saved))));
}

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

const Manifest& CheckpointReader::manifest() const { return impl_->saved_->manifest(); }

absl::StatusOr<at::Tensor> CheckpointReader::ReadTensor(const std::string& name) const {
  auto it = impl_->saved_->tensors().find(name);
  if (it == impl_->saved_->tensors().end()) {
    return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in the checkpoint"));
  }
  at::Tensor tensor =
      at::empty(it->second.info.shape, at::TensorOptions().dtype(it->second.info.dtype));
  const size_t slash = name.find('/');
  LoadReport report;
  StateReader reader(*impl_->saved_, name.substr(0, slash), report);
  KEEL_RETURN_IF_ERROR(reader.ReadTensor(name.substr(slash + 1), {tensor}));
  return tensor;
}

absl::StatusOr<base::Json> CheckpointReader::ReadValues(const std::string& name) const {
  auto it = impl_->saved_->values().find(name);
  if (it == impl_->saved_->values().end()) {
    return absl::NotFoundError(absl::StrCat("no object \"", name, "\" in the checkpoint"));
  }
  return it->second;
}

}  // namespace keel::checkpoint
