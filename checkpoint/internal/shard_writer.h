// Writing one rank's shard file, and rank 0's merge of every rank's written files and chunks
// into the manifest.
#ifndef KEEL_CHECKPOINT_INTERNAL_SHARD_WRITER_H_
#define KEEL_CHECKPOINT_INTERNAL_SHARD_WRITER_H_

#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/manifest.pb.h"
#include "checkpoint/state_dict.h"

namespace keel::checkpoint::internal {

// A block this rank writes: its bytes (host, contiguous) and its manifest entry (one chunk,
// without file placement).
struct WriteItem {
  at::Tensor bytes;
  TensorEntry entry;
};

// Writes `items` into "<dir>/__<rank>.keel" (each chunk 4096-aligned) or ".safetensors" (with
// each block's offsets in the header metadata), fsynced. Returns the file and its chunks as a
// partial manifest (file index 0); an empty one when there are no items.
// Errors: from the file layer (kResourceExhausted for a full disk), naming the tensor.
[[nodiscard]] absl::StatusOr<Manifest> WriteShard(const std::string& dir, int rank,
                                                  SerializationFormat format,
                                                  const std::vector<WriteItem>& items);

// Adds every rank's written part (serialized WriteShard results, in rank order) to `manifest`,
// whose tensors are listed without chunks: files are appended, each chunk goes to its tensor
// with its file index shifted, and each tensor's chunks are sorted by offsets.
// Errors: kInternal for a part that does not parse or names an unknown tensor.
[[nodiscard]] absl::Status MergeWritten(const std::vector<std::string>& written,
                                        Manifest& manifest);

}  // namespace keel::checkpoint::internal

#endif  // KEEL_CHECKPOINT_INTERNAL_SHARD_WRITER_H_
