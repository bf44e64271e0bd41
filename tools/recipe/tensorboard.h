// TensorBoard event files for the trainer's scalars: the TFRecord framing and masked CRC-32C
// of tensorboard/summary/writer/record_writer.py (RecordWriter) around serialized
// keel.tools.recipe.tensorboard.Event messages (tools/recipe/tensorboard_event.proto).
//
//   KEEL_ASSIGN_OR_RETURN(auto events, TensorBoardWriter::Create(run_dir + "/tensorboard", now));
//   KEEL_RETURN_IF_ERROR(events.AddScalar("train/loss", step, loss, now));
//   KEEL_RETURN_IF_ERROR(events.Flush());
#ifndef KEEL_TOOLS_RECIPE_TENSORBOARD_H_
#define KEEL_TOOLS_RECIPE_TENSORBOARD_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/files.h"
#include "tools/recipe/metrics.h"

namespace keel::tools::recipe {

// Writes TensorBoard scalars to `<dir>/events.out.tfevents.<unix seconds>.<hostname>.keel`:
// TFRecords (uint64 LE length, masked CRC-32C of those 8 bytes, a serialized Event, masked
// CRC-32C of it), the first one carrying file_version "brain.Event:2".
class TensorBoardWriter {
 public:
  // Creates `dir` if it is missing (its parent must exist) and the event file in it, named from
  // `wall_time` (seconds since the Unix epoch); an existing file of that name gets a ".1",
  // ".2", ... suffix instead of being overwritten.
  // Errors: base::ErrnoCode's, with a message naming the directory or file.
  [[nodiscard]] static absl::StatusOr<TensorBoardWriter> Create(const std::string& dir,
                                                                double wall_time);

  // Appends Event{wall_time, step, summary{value{tag, simple_value}}} with one write(2).
  // `value` is stored as a float, which is what simple_value holds.
  // Errors: kInvalidArgument for an empty tag; otherwise base::ErrnoCode's naming the file.
  [[nodiscard]] absl::Status AddScalar(absl::string_view tag, int64_t step, double value,
                                       double wall_time);

  // fsyncs the file, so the events survive a machine crash. Errors: base::ErrnoCode's.
  [[nodiscard]] absl::Status Flush();

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, base::UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}

  std::string path_;
  base::UniqueFd fd_;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF).
uint32_t Crc32c(absl::string_view data);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 of Crc32c(data).
uint32_t MaskedCrc32c(absl::string_view data);

// A step's scalars at `wall_time`: train/loss, train/lr, train/grad_norm, and where the step
// has them train/max_memory_allocated_gib, val/loss, train/skipped_steps, moe/aux_loss and
// moe/tokens_per_expert/<expert>.
// Errors: AddScalar's.
[[nodiscard]] absl::Status AddStepScalars(TensorBoardWriter& writer, const StepMetrics& metrics,
                                          double wall_time);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_TENSORBOARD_H_
