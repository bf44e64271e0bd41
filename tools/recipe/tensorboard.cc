#include "tools/recipe/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "tools/recipe/tensorboard_event.pb.h"

namespace keel::tools::recipe {
namespace {

// The CRC-32C table for one byte at a time, reflected polynomial 0x82F63B78.
struct Crc32cTable {
  uint32_t entries[256];
  constexpr Crc32cTable() : entries() {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      uint32_t crc = byte;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
      entries[byte] = crc;
    }
  }
};
constexpr Crc32cTable kCrc32cTable;

void AppendLittleEndian(uint64_t value, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// One TFRecord: length, masked CRC of the length bytes, data, masked CRC of the data.
std::string TfRecord(absl::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  AppendLittleEndian(data.size(), 8, record);
  AppendLittleEndian(MaskedCrc32c(record), 4, record);
  record.append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data), 4, record);
  return record;
}

absl::Status WriteEvent(int fd, const tensorboard::Event& event, const std::string& path) {
  std::string bytes;
  if (!event.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat("cannot serialize an Event for ", path));
  }
  return base::WriteAll(fd, TfRecord(bytes), path);
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = (crc >> 8) ^ kCrc32cTable.entries[(crc ^ byte) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

absl::StatusOr<TensorBoardWriter> TensorBoardWriter::Create(const std::string& dir,
                                                            double wall_time) {
  KEEL_RETURN_IF_ERROR(
      base::Annotate(base::MakeDirectory(dir), "creating the TensorBoard directory"));
  const std::string base = absl::StrCat(dir, "/events.out.tfevents.",
                                        static_cast<int64_t>(wall_time), ".", HostName(), ".keel");
  std::string path = base;
  absl::StatusOr<base::UniqueFd> fd;
  for (int suffix = 1;; ++suffix) {
    fd = base::OpenFile(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND);
    if (fd.ok() || !absl::IsAlreadyExists(fd.status()) || suffix > 1000) break;
    path = absl::StrCat(base, ".", suffix);
  }
  KEEL_RETURN_IF_ERROR(base::Annotate(fd.status(), "creating the event file"));
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version("brain.Event:2");
  if (absl::Status status = WriteEvent(fd->get(), event, path); !status.ok()) {
    base::RemoveTree(path).IgnoreError();
    return status;
  }
  return TensorBoardWriter(path, *std::move(fd));
}

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, int64_t step, double value,
                                          double wall_time) {
  if (tag.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TensorBoard scalar tag must not be empty (step ", step, ", file ", path_, ")"));
  }
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary::Value* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(std::string(tag));
  scalar->set_simple_value(static_cast<float>(value));
  return WriteEvent(fd_.get(), event, path_);
}

absl::Status TensorBoardWriter::Flush() {
  if (::fsync(fd_.get()) != 0) return base::ErrnoError("fsync of", path_);
  return absl::OkStatus();
}

absl::Status AddStepScalars(TensorBoardWriter& writer, const StepMetrics& metrics,
                            double wall_time) {
  const int64_t step = metrics.step;
  KEEL_RETURN_IF_ERROR(writer.AddScalar("train/loss", step, metrics.loss, wall_time));
  KEEL_RETURN_IF_ERROR(writer.AddScalar("train/lr", step, metrics.lr, wall_time));
  KEEL_RETURN_IF_ERROR(writer.AddScalar("train/grad_norm", step, metrics.grad_norm, wall_time));
  if (metrics.max_memory_allocated_gib) {
    KEEL_RETURN_IF_ERROR(writer.AddScalar("train/max_memory_allocated_gib", step,
                                          *metrics.max_memory_allocated_gib, wall_time));
  }
  if (metrics.val_loss) {
    KEEL_RETURN_IF_ERROR(writer.AddScalar("val/loss", step, *metrics.val_loss, wall_time));
  }
  if (metrics.moe_aux_loss) {
    KEEL_RETURN_IF_ERROR(writer.AddScalar("moe/aux_loss", step, *metrics.moe_aux_loss, wall_time));
  }
  if (metrics.tokens_per_expert) {
    for (size_t e = 0; e < metrics.tokens_per_expert->size(); ++e) {
      KEEL_RETURN_IF_ERROR(writer.AddScalar(absl::StrCat("moe/tokens_per_expert/", e), step,
                                            static_cast<double>((*metrics.tokens_per_expert)[e]),
                                            wall_time));
    }
  }
  if (metrics.skipped_steps) {
    KEEL_RETURN_IF_ERROR(writer.AddScalar("train/skipped_steps", step,
                                          static_cast<double>(*metrics.skipped_steps), wall_time));
  }
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
