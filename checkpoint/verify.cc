// Verify, FindLatest and ApplyRetention: what is on disk, checked without loading it.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/internal/files.h"
#include "checkpoint/internal/layout.h"
#include "checkpoint/manifest.h"

namespace keel::checkpoint {
namespace {

constexpr size_t kVerifyBlock = size_t{1} << 20;

// A chunk of one shard file, in file order.
struct Region {
  const TensorEntry* tensor;
  const Chunk* chunk;
};

std::vector<Region> RegionsOfFile(const Manifest& manifest, int f) {
  std::vector<Region> regions;
  for (const TensorEntry& tensor : manifest.tensors()) {
    for (const Chunk& chunk : tensor.chunks()) {
      if (chunk.file() == static_cast<uint32_t>(f)) regions.push_back({&tensor, &chunk});
    }
  }
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) {
    return a.chunk->byte_offset() < b.chunk->byte_offset();
  });
  return regions;
}

// Reads one shard file once, feeding [position, end) ranges to hashers block by block.
class FileScan {
 public:
  FileScan(int fd, std::string path) : fd_(fd), path_(std::move(path)), buffer_(kVerifyBlock, 0) {}

  uint64_t position() const { return position_; }

  template <typename Sink>
  absl::Status Feed(uint64_t end, Sink&& sink) {
    while (position_ < end) {
      const size_t length = static_cast<size_t>(std::min<uint64_t>(end - position_, kVerifyBlock));
      KEEL_RETURN_IF_ERROR(base::PreadAll(fd_, path_, buffer_.data(), length, position_));
      sink(buffer_.data(), length);
      position_ += length;
    }
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
  std::string buffer_;
  uint64_t position_ = 0;
};

// Re-reads shard file `f` once: each chunk's checksum (a problem naming the tensor when it
// differs), then the file checksum over the rest. Errors: only failures to read.
absl::Status VerifyFileBytes(const Manifest& manifest, int f, const std::string& file_path,
                             std::vector<VerifyProblem>& problems) {
  KEEL_ASSIGN_OR_RETURN(base::UniqueFd fd, base::OpenFile(file_path, O_RDONLY));
  FileScan scan(fd.get(), file_path);
  internal::Hasher summary;
  auto raw = [&](const char* data, size_t length) { summary.Update(data, length); };
  const size_t before = problems.size();
  for (const Region& region : RegionsOfFile(manifest, f)) {
    const std::string& name = region.tensor->name();
    if (region.chunk->byte_offset() < scan.position()) {
      problems.push_back(
          {file_path, name,
           absl::StrCat(file_path, ": chunks of \"", name, "\" overlap others in the file")});
      return absl::OkStatus();
    }
    KEEL_RETURN_IF_ERROR(scan.Feed(region.chunk->byte_offset(), raw));
    internal::SegmentHasher chunk;
    KEEL_RETURN_IF_ERROR(
        scan.Feed(region.chunk->byte_offset() + region.chunk->byte_length(),
                  [&](const char* data, size_t length) { chunk.Update(data, length); }));
    const uint64_t digest = chunk.Digest();
    if (digest != region.chunk->xxh3()) {
      problems.push_back(
          {file_path, name,
           absl::StrCat(file_path, ": tensor \"", name, "\" chunk at offsets [",
                        absl::StrJoin(region.chunk->offsets(), ", "), "] fails its checksum (xxh3 ",
                        digest, ", manifest says ", region.chunk->xxh3(), ")")});
    }
    char bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((digest >> (8 * i)) & 0xff);
    summary.Update(bytes, sizeof(bytes));
  }
  KEEL_RETURN_IF_ERROR(scan.Feed(manifest.files(f).size(), raw));
  if (problems.size() == before && summary.Digest() != manifest.files(f).xxh3()) {
    problems.push_back(
        {file_path, "",
         absl::StrCat(file_path, ": fails its checksum outside tensor data (xxh3 ",
                      summary.Digest(), ", manifest says ", manifest.files(f).xxh3(), ")")});
  }
  return absl::OkStatus();
}

// The problems of file `f` that its size shows: missing, or not the manifest's size.
std::optional<VerifyProblem> CheckFileSize(const FileEntry& file, const std::string& file_path) {
  struct stat st;
  if (::stat(file_path.c_str(), &st) != 0) {
    return VerifyProblem{file_path, "",
                         absl::StrCat(file_path, ": missing (",
                                      base::ErrnoError("examining", file_path).message(), ")")};
  }
  if (static_cast<uint64_t>(st.st_size) != file.size()) {
    return VerifyProblem{
        file_path, "",
        absl::StrCat(file_path, ": ", st.st_size, " bytes, the manifest says ", file.size())};
  }
  return std::nullopt;
}

}  // namespace

absl::Status VerifyReport::ToStatus() const {
  if (ok()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const VerifyProblem& problem : problems) lines.push_back(problem.message);
  return absl::DataLossError(absl::StrJoin(lines, "; "));
}

absl::StatusOr<VerifyReport> Verify(const std::string& path, VerifyLevel level) {
  VerifyReport report;
  report.checkpoint.path = path;
  absl::StatusOr<Manifest> manifest = ReadManifest(path);
  if (absl::IsDataLoss(manifest.status())) {
    report.problems.push_back({ManifestPath(path), "", std::string(manifest.status().message())});
    return report;
  }
  KEEL_RETURN_IF_ERROR(manifest.status());
  report.checkpoint.step = manifest->step();
  report.checkpoint.epoch = manifest->epoch();
  report.files = manifest->files_size();
  report.tensors = manifest->tensors_size();
  report.objects = manifest->objects_size();
  report.objects_with_values_per_rank = ObjectsWithValuesPerRank(*manifest);
  for (int f = 0; f < manifest->files_size(); ++f) {
    const FileEntry& file = manifest->files(f);
    const std::string file_path = base::JoinPath(path, file.name());
    report.bytes += file.size();
    if (std::optional<VerifyProblem> problem = CheckFileSize(file, file_path)) {
      report.problems.push_back(*std::move(problem));
      continue;
    }
    if (level != VerifyLevel::kChecksums) continue;
    KEEL_RETURN_IF_ERROR(VerifyFileBytes(*manifest, f, file_path, report.problems));
  }
  return report;
}

absl::StatusOr<FindResult> FindLatest(const std::string& checkpoint_dir, VerifyLevel level) {
  KEEL_ASSIGN_OR_RETURN(std::vector<internal::CommittedStep> steps,
                        internal::ListCommitted(checkpoint_dir));
  FindResult result;
  for (const internal::CommittedStep& step : steps) {
    absl::StatusOr<VerifyReport> report = Verify(step.path, level);
    const absl::Status status = report.ok() ? report->ToStatus() : report.status();
    if (!status.ok()) {
      result.warnings.push_back(absl::StrCat("skipping ", step.path, ": ", status.message()));
      continue;
    }
    result.latest = report->checkpoint;
    result.report = *std::move(report);
    break;
  }
  return result;
}

absl::Status ApplyRetention(const std::string& checkpoint_dir, const CheckpointerOptions& options,
                            const std::vector<std::string>& keep) {
  KEEL_ASSIGN_OR_RETURN(std::vector<std::string> names, base::ListDirectory(checkpoint_dir));
  for (const std::string& name : names) {
    if (internal::IsLeftover(name)) {
      KEEL_RETURN_IF_ERROR(base::RemoveTree(base::JoinPath(checkpoint_dir, name)));
    }
  }
  KEEL_ASSIGN_OR_RETURN(std::vector<internal::CommittedStep> steps,
                        internal::ListCommitted(checkpoint_dir));
  KEEL_ASSIGN_OR_RETURN(FindResult newest, FindLatest(checkpoint_dir));
  auto kept = [&](size_t index, const internal::CommittedStep& step) {
    if (options.keep_last_k == 0 || static_cast<int64_t>(index) < options.keep_last_k) return true;
    if (options.keep_every_n_steps > 0 && step.step % options.keep_every_n_steps == 0) return true;
    if (newest.latest && newest.latest->path == step.path) return true;
    return std::any_of(keep.begin(), keep.end(),
                       [&](const std::string& k) { return internal::SamePath(k, step.path); });
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    if (kept(i, steps[i])) continue;
    const std::string doomed =
        base::JoinPath(checkpoint_dir, internal::DeletingDirName(steps[i].name));
    KEEL_RETURN_IF_ERROR(base::RenameDurably(steps[i].path, doomed));
    KEEL_RETURN_IF_ERROR(base::RemoveTree(doomed));
  }
  return absl::OkStatus();
}

}  // namespace keel::checkpoint
