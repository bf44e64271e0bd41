#include "checkpoint/internal/disk_state.h"

#include <fcntl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "checkpoint/internal/dtype.h"
#include "checkpoint/internal/files.h"
#include "checkpoint/internal/manifest_io.h"
#include "checkpoint/manifest.h"

namespace keel::checkpoint::internal {

absl::StatusOr<std::unique_ptr<DiskSavedState>> DiskSavedState::Open(const std::string& path,
                                                                     int loading_rank,
                                                                     int loading_world_size) {
  KEEL_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(path));
  auto state = std::unique_ptr<DiskSavedState>(new DiskSavedState(path, std::move(manifest)));
  state->loading_rank_ = loading_rank;
  state->loading_world_size_ = loading_world_size;
  KEEL_RETURN_IF_ERROR(state->Index());
  return state;
}

DiskSavedState::DiskSavedState(std::string path, Manifest manifest)
    : path_(std::move(path)), manifest_(std::move(manifest)), fds_(manifest_.files_size()) {}

absl::Status DiskSavedState::ReadChunk(const std::string& key, const SavedChunk& chunk,
                                       void* out) const {
  const ChunkLocation& location = locations_[chunk.source_index];
  const std::string file_path = base::JoinPath(path_, manifest_.files(location.file).name());
  KEEL_ASSIGN_OR_RETURN(int fd, FileDescriptor(location.file, key));
  absl::StatusOr<uint64_t> actual =
      PreadChunk(fd, file_path, out, location.byte_length, location.byte_offset);
  KEEL_RETURN_IF_ERROR(base::Annotate(actual.status(), absl::StrCat("tensor \"", key, "\"")));
  if (*actual != location.xxh3) {
    return absl::DataLossError(absl::StrCat(file_path, ": tensor \"", key, "\" chunk at offsets [",
                                            absl::StrJoin(location.offsets, ", "),
                                            "] fails its checksum (xxh3 ", *actual,
                                            ", manifest says ", location.xxh3, ")"));
  }
  return absl::OkStatus();
}

absl::Status DiskSavedState::Index() {
  for (const TensorEntry& entry : manifest_.tensors()) {
    SavedTensor& tensor = tensors_[entry.name()];
    KEEL_ASSIGN_OR_RETURN(tensor.info.dtype, ParseDtype(entry.dtype()));
    tensor.info.shape.assign(entry.shape().begin(), entry.shape().end());
    for (const Chunk& chunk : entry.chunks()) {
      SavedChunk saved;
      saved.offsets.assign(chunk.offsets().begin(), chunk.offsets().end());
      saved.lengths.assign(chunk.lengths().begin(), chunk.lengths().end());
      saved.source_index = static_cast<int64_t>(locations_.size());
      locations_.push_back(
          {chunk.file(), chunk.byte_offset(), chunk.byte_length(), chunk.xxh3(), saved.offsets});
      tensor.chunks.push_back(std::move(saved));
    }
  }
  saved_world_size_ = manifest_.world_size();
  for (const ObjectEntry& object : manifest_.objects()) {
    std::vector<base::Json>& values = values_[object.name()];
    auto add = [&](const Value& value) -> absl::Status {
      absl::StatusOr<base::Json> json = ValueToJson(value);
      if (!json.ok()) {
        return absl::DataLossError(
            absl::StrCat(path_, ": object \"", object.name(), "\": ", json.status().message()));
      }
      values.push_back(*std::move(json));
      return absl::OkStatus();
    };
    if (object.rank_values().empty()) KEEL_RETURN_IF_ERROR(add(object.value()));
    for (const RankValue& entry : object.rank_values()) KEEL_RETURN_IF_ERROR(add(entry.value()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DiskSavedState::FileDescriptor(uint32_t file, const std::string& key) const {
  std::lock_guard<std::mutex> lock(fds_mutex_);
  if (!fds_[file].valid()) {
    const std::string file_path = base::JoinPath(path_, manifest_.files(file).name());
    absl::StatusOr<base::UniqueFd> fd = base::OpenFile(file_path, O_RDONLY);
    if (!fd.ok()) {
      return absl::DataLossError(
          absl::StrCat("shard file of tensor \"", key, "\" unreadable: ", fd.status().message()));
    }
    fds_[file] = *std::move(fd);
  }
  return fds_[file].get();
}

}  // namespace keel::checkpoint::internal
