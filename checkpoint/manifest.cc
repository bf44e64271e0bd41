#include "checkpoint/manifest.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/status.h"
#include "checkpoint/internal/manifest_io.h"

namespace keel::checkpoint {

std::string ManifestPath(const std::string& path) {
  return base::JoinPath(path, internal::kManifestName);
}

absl::StatusOr<Manifest> ReadManifest(const std::string& path) {
  const std::string manifest_path = ManifestPath(path);
  absl::StatusOr<std::string> bytes = base::ReadFile(manifest_path);
  if (absl::IsNotFound(bytes.status())) {
    return base::Annotate(bytes.status(), absl::StrCat("no checkpoint at ", path));
  }
  KEEL_RETURN_IF_ERROR(bytes.status());
  return internal::DecodeManifest(*bytes, manifest_path);
}

int64_t ObjectsWithValuesPerRank(const Manifest& manifest) {
  return std::count_if(manifest.objects().begin(), manifest.objects().end(),
                       [](const ObjectEntry& object) { return !object.rank_values().empty(); });
}

}  // namespace keel::checkpoint
