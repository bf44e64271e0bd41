#include "checkpoint/internal/shard_writer.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"
#include "checkpoint/internal/files.h"
#include "checkpoint/safetensors.h"

namespace keel::checkpoint::internal {
namespace {

constexpr uint64_t kKeelAlignment = 4096;

// The safetensors header for `items`, each block's global offsets in its metadata; the data
// offset of each item is `header.size() + entry.begin`.
absl::StatusOr<std::string> SafetensorsHeader(const std::vector<WriteItem>& items,
                                              std::vector<uint64_t>& offsets) {
  std::vector<SafetensorsEntry> entries;
  base::Json sharding = base::Json::object();
  for (const WriteItem& item : items) {
    const Chunk& chunk = item.entry.chunks(0);
    SafetensorsEntry entry;
    entry.name = item.entry.name();
    entry.dtype = item.bytes.scalar_type();
    entry.shape.assign(chunk.lengths().begin(), chunk.lengths().end());
    entries.push_back(std::move(entry));
    sharding[item.entry.name()]["saved_offsets"] =
        std::vector<int64_t>(chunk.offsets().begin(), chunk.offsets().end());
  }
  KEEL_ASSIGN_OR_RETURN(std::string header,
                        EncodeSafetensorsHeader(
                            entries, {{"format", "pt"}, {"keel_sharding_info", sharding.dump()}}));
  for (const SafetensorsEntry& entry : entries) offsets.push_back(header.size() + entry.begin);
  return header;
}

}  // namespace

absl::StatusOr<Manifest> WriteShard(const std::string& dir, int rank, SerializationFormat format,
                                    const std::vector<WriteItem>& items) {
  Manifest written;
  if (items.empty()) return written;
  const bool keel = format == SerializationFormat::kKeel;
  const std::string name = absl::StrCat("__", rank, keel ? ".keel" : ".safetensors");
  KEEL_ASSIGN_OR_RETURN(OutputFile file, OutputFile::Create(base::JoinPath(dir, name)));
  std::vector<uint64_t> offsets;
  if (!keel) {
    KEEL_ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(items, offsets));
    KEEL_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const WriteItem& item = items[i];
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
    KEEL_RETURN_IF_ERROR(
        base::Annotate(checksum.status(), absl::StrCat("tensor \"", item.entry.name(), "\"")));
    chunk->set_xxh3(*checksum);
  }
  KEEL_RETURN_IF_ERROR(file.Close());
  FileEntry* entry = written.add_files();
  entry->set_name(name);
  entry->set_size(file.size());
  entry->set_xxh3(file.checksum());
  entry->set_rank(rank);
  return written;
}

absl::Status MergeWritten(const std::vector<std::string>& written, Manifest& manifest) {
  std::map<std::string, TensorEntry*> tensors;
  for (TensorEntry& tensor : *manifest.mutable_tensors()) tensors[tensor.name()] = &tensor;
  for (const std::string& bytes : written) {
    Manifest part;
    if (!part.ParseFromString(bytes)) return absl::InternalError("unparsable shard result");
    const uint32_t base = static_cast<uint32_t>(manifest.files_size());
    for (const FileEntry& file : part.files()) *manifest.add_files() = file;
    for (const TensorEntry& tensor : part.tensors()) {
      auto it = tensors.find(tensor.name());
      if (it == tensors.end()) {
        return absl::InternalError(
            absl::StrCat("shard result names unplanned tensor \"", tensor.name(), "\""));
      }
      Chunk* chunk = it->second->add_chunks();
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
  return absl::OkStatus();
}

}  // namespace keel::checkpoint::internal
