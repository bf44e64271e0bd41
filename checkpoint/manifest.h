// The manifest of a Keel checkpoint: one protobuf message (checkpoint/manifest.proto) per step
// directory naming its shard files, its tensors with their chunks and checksums, and each
// object's values. For tools that describe a checkpoint without loading it; loading goes
// through checkpoint.h.
//
//   KEEL_ASSIGN_OR_RETURN(keel::checkpoint::Manifest manifest, ReadManifest(step_dir));
//   for (const auto& tensor : manifest.tensors()) std::cout << tensor.name() << "\n";
#ifndef KEEL_CHECKPOINT_MANIFEST_H_
#define KEEL_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"

namespace keel::checkpoint {

// The manifest file of the checkpoint directory `path`.
std::string ManifestPath(const std::string& path);

// The manifest of the checkpoint at `path`, checked (checksum, version, structure).
// Errors: kNotFound (no checkpoint at `path`); kDataLoss naming the file for corrupt or
// truncated bytes; kFailedPrecondition for a format version newer than this Keel's.
[[nodiscard]] absl::StatusOr<Manifest> ReadManifest(const std::string& path);

// The number of objects of `manifest` whose ranks saved different values, held per rank.
int64_t ObjectsWithValuesPerRank(const Manifest& manifest);

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_MANIFEST_H_
