#include "tools/recipe/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/fields.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

// Cuts a partial last line (no trailing '\n') off the file open as `fd`.
absl::Status TrimPartialLine(int fd, const std::string& path) {
  struct stat info;
  if (::fstat(fd, &info) != 0) return base::ErrnoError("examining", path);
  off_t end = info.st_size;
  char buffer[4096];
  while (end > 0) {
    const off_t start = std::max<off_t>(0, end - static_cast<off_t>(sizeof(buffer)));
    const size_t size = static_cast<size_t>(end - start);
    KEEL_RETURN_IF_ERROR(base::PreadAll(fd, path, buffer, size, static_cast<uint64_t>(start)));
    if (end == info.st_size && buffer[size - 1] == '\n') return absl::OkStatus();
    for (size_t i = size; i > 0; --i) {
      if (buffer[i - 1] == '\n') {
        end = start + static_cast<off_t>(i);
        if (::ftruncate(fd, end) != 0) return base::ErrnoError("truncating", path);
        return absl::OkStatus();
      }
    }
    end = start;
  }
  if (info.st_size > 0 && ::ftruncate(fd, 0) != 0) return base::ErrnoError("truncating", path);
  return absl::OkStatus();
}

std::string Duration(double seconds) {
  if (!(seconds < 1e8)) return ">1000d";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string Throughput(double value) {
  if (!std::isfinite(value) || std::abs(value) < 1e3) return absl::StrFormat("%.0f", value);
  if (std::abs(value) < 1e6) return absl::StrFormat("%.1fk", value / 1e3);
  if (std::abs(value) < 1e9) return absl::StrFormat("%.1fM", value / 1e6);
  return absl::StrFormat("%.1fG", value / 1e9);
}

}  // namespace

absl::StatusOr<JsonlWriter> JsonlWriter::Create(const std::string& path, bool append) {
  const int flags = O_CREAT | (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC);
  absl::StatusOr<base::UniqueFd> fd = base::OpenFile(path, flags);
  KEEL_RETURN_IF_ERROR(base::Annotate(fd.status(), "opening the metrics file"));
  if (append) KEEL_RETURN_IF_ERROR(TrimPartialLine(fd->get(), path));
  return JsonlWriter(path, *std::move(fd));
}

absl::Status JsonlWriter::Write(const StepMetrics& metrics) {
  return base::WriteAll(fd_.get(), absl::StrCat(base::WriteJsonFields(metrics).dump(), "\n"),
                        path_);
}

absl::StatusOr<std::vector<StepMetrics>> ReadJsonl(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(const std::string contents, base::ReadFile(path));
  std::vector<StepMetrics> history;
  size_t line_start = 0;
  for (int64_t line_number = 1; line_start < contents.size(); ++line_number) {
    size_t line_end = contents.find('\n', line_start);
    if (line_end == std::string::npos) line_end = contents.size();
    const absl::string_view line(contents.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;

    const std::string where = absl::StrCat(path, ":", line_number, ": ");
    absl::StatusOr<base::Json> json = base::ParseJson(line);
    if (!json.ok() && line_end == contents.size()) break;  // a last write cut short
    if (!json.ok()) return absl::DataLossError(absl::StrCat(where, json.status().message()));
    if (!json->is_object()) {
      return absl::DataLossError(absl::StrCat(where, "expected a JSON object, got ", line));
    }
    StepMetrics metrics;
    std::string missing;
    VisitFields(metrics, [&](absl::string_view name, const auto& field) {
      using Field = std::decay_t<decltype(field)>;
      if (!base::IsOptional<Field>::value && missing.empty() &&
          !json->contains(std::string(name))) {
        missing = std::string(name);
      }
    });
    if (!missing.empty()) {
      return absl::DataLossError(absl::StrCat(where, "missing field \"", missing, "\""));
    }
    if (absl::Status status = base::ReadJsonFields(*json, metrics); !status.ok()) {
      return absl::DataLossError(absl::StrCat(where, status.message()));
    }
    while (!history.empty() && history.back().step >= metrics.step) history.pop_back();
    history.push_back(metrics);
  }
  return history;
}

std::string ProgressLine(const StepMetrics& metrics, int64_t max_steps, int64_t start_step) {
  std::string line;
  if (max_steps > 0) {
    const int width = static_cast<int>(absl::StrCat(max_steps).size());
    line = absl::StrFormat("step %*d/%d", width, metrics.step, max_steps);
  } else {
    line = absl::StrFormat("step %d", metrics.step);
  }
  absl::StrAppend(&line, absl::StrFormat(" | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s",
                                         metrics.loss, metrics.lr, metrics.grad_norm,
                                         Throughput(metrics.tokens_per_second.value_or(0.0))));
  if (metrics.max_memory_allocated_gib.has_value()) {
    absl::StrAppend(&line, absl::StrFormat(" | mem %.2f GiB", *metrics.max_memory_allocated_gib));
  }
  if (metrics.val_loss.has_value()) {
    absl::StrAppend(&line, absl::StrFormat(" | val loss %.4f", *metrics.val_loss));
  }
  if (metrics.skipped_steps.value_or(0) > 0) {
    absl::StrAppend(&line, " | skipped ", *metrics.skipped_steps);
  }
  if (max_steps > 0) {
    const int64_t done = metrics.step - start_step;
    const double per_step = done > 0 ? metrics.elapsed_seconds / static_cast<double>(done) : NAN;
    if (std::isfinite(per_step) && per_step >= 0) {
      const int64_t remaining = std::max<int64_t>(0, max_steps - metrics.step);
      absl::StrAppend(&line, " | ETA ", Duration(per_step * static_cast<double>(remaining)));
    } else {
      absl::StrAppend(&line, " | ETA --");
    }
  }
  return line;
}

}  // namespace keel::tools::recipe
