// The manifest file ("manifest.pb": magic, length, XXH3-64, then the Manifest message) and the
// conversions between StateDict values (JSON) and the manifest's typed Value messages.
#ifndef KEEL_CHECKPOINT_INTERNAL_MANIFEST_IO_H_
#define KEEL_CHECKPOINT_INTERNAL_MANIFEST_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/json.h"
#include "checkpoint/manifest.pb.h"

namespace keel::checkpoint::internal {

// The newest format version this Keel reads. 1: each object's values once; 2: also values
// per rank (ObjectEntry.rank_values).
inline constexpr uint32_t kFormatVersion = 2;
// The first format version with values per rank.
inline constexpr uint32_t kPerRankValuesVersion = 2;
inline constexpr char kManifestName[] = "manifest.pb";
inline constexpr char kKeelVersion[] = "0.1.0";

// The version to write `manifest` with: the lowest that holds it (1 unless an object has
// values per rank), so that a Keel reading version 1 refuses only what it would misread.
uint32_t LowestFormatVersion(const Manifest& manifest);

std::string EncodeManifest(const Manifest& manifest);
// Parses and checks a manifest file's bytes: magic, length, checksum, format version, and the
// structure (dtypes, chunks inside their tensor and their file, chunks covering each tensor,
// values once or per rank of world_size in rank order).
// Errors: kDataLoss naming `path` and, where there is one, the tensor; kFailedPrecondition for
// a format version newer than this Keel's.
[[nodiscard]] absl::StatusOr<Manifest> DecodeManifest(absl::string_view bytes,
                                                      const std::string& path);

void JsonToValue(const base::Json& json, Value& value);
[[nodiscard]] absl::StatusOr<base::Json> ValueToJson(const Value& value);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_MANIFEST_IO_H_
