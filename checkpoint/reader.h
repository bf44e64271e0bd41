// Whole tensors and values (once, or per saving rank) of one checkpoint, read outside a training
// run: for tools that inspect, compare or export checkpoints (tools:ckpt, hf_export). Training
// loads go through Checkpointer::Load, which reads only the blocks each rank holds.
//
//   KEEL_ASSIGN_OR_RETURN(auto reader, keel::checkpoint::CheckpointReader::Open(step_dir));
//   KEEL_ASSIGN_OR_RETURN(at::Tensor w, reader->ReadTensor("model/lm_head.weight"));
#ifndef KEEL_CHECKPOINT_READER_H_
#define KEEL_CHECKPOINT_READER_H_

#include <memory>
#include <string>
#include <vector>

#include "ATen/core/Tensor.h"
#include "absl/status/statusor.h"
#include "base/json.h"
#include "checkpoint/manifest.h"

namespace keel::checkpoint {

class CheckpointReader {
 public:
  // Errors: as ReadManifest.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& path);
  ~CheckpointReader();

  const Manifest& manifest() const;
  // The whole tensor `name` ("<object>/<key>"), on the CPU, checksums checked.
  // Errors: kNotFound for an unknown name; kDataLoss.
  [[nodiscard]] absl::StatusOr<at::Tensor> ReadTensor(const std::string& name) const;
  // The non-tensor values of the object `name`, saved once for every rank.
  // Errors: kNotFound; kFailedPrecondition when its ranks saved different values (then read
  // them with ReadValuesOfEachRank).
  [[nodiscard]] absl::StatusOr<base::Json> ReadValues(const std::string& name) const;
  // Every saving rank's values of the object `name`, in rank order: manifest().world_size()
  // entries, values saved once counting as every rank's. Errors: kNotFound.
  [[nodiscard]] absl::StatusOr<std::vector<base::Json>> ReadValuesOfEachRank(
      const std::string& name) const;

 private:
  class Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::checkpoint

#endif  // KEEL_CHECKPOINT_READER_H_
