#include "tools/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
#include "base/json.h"
#include "base/status.h"
#include "tools/tensorboard_event.pb.h"

namespace keel::tools {
namespace {

// The status for the failed system call `what` (errno's code, path and reason).
absl::Status SystemError(absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view path) {
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return SystemError("cannot write", path);
    }
    data.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SystemError("cannot open", path);
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      absl::Status status = SystemError("cannot read", path);
      ::close(fd);
      return status;
    }
    if (got == 0) break;
    contents.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  return contents;
}

// Cuts a partial last line (no trailing '\n') off the file open as `fd`.
absl::Status TrimPartialLine(int fd, const std::string& path) {
  struct stat info;
  if (::fstat(fd, &info) != 0) return SystemError("cannot stat", path);
  off_t end = info.st_size;
  char buffer[4096];
  while (end > 0) {
    const off_t start = std::max<off_t>(0, end - static_cast<off_t>(sizeof(buffer)));
    const size_t size = static_cast<size_t>(end - start);
    const ssize_t got = ::pread(fd, buffer, size, start);
    if (got != static_cast<ssize_t>(size)) return SystemError("cannot read", path);
    if (end == info.st_size && buffer[size - 1] == '\n') return absl::OkStatus();
    for (size_t i = size; i > 0; --i) {
      if (buffer[i - 1] == '\n') {
        end = start + static_cast<off_t>(i);
        if (::ftruncate(fd, end) != 0) return SystemError("cannot truncate", path);
        return absl::OkStatus();
      }
    }
    end = start;
  }
  if (info.st_size > 0 && ::ftruncate(fd, 0) != 0) return SystemError("cannot truncate", path);
  return absl::OkStatus();
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

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
  return WriteAll(fd, TfRecord(bytes), path);
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// --- SVG plot ---

constexpr double kWidth = 800;
constexpr double kHeight = 600;
constexpr double kLeft = 90;
constexpr double kRight = 770;

struct Panel {
  double top;
  double bottom;
  double x_min;
  double x_max;
  double y_min;
  double y_max;
  double X(double x) const { return kLeft + (x - x_min) / (x_max - x_min) * (kRight - kLeft); }
  double Y(double y) const { return bottom - (y - y_min) / (y_max - y_min) * (bottom - top); }
};

// A tick spacing of 1, 2 or 5 times a power of ten giving about `target` intervals.
double NiceStep(double range, int target) {
  const double raw = range / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / power;
  if (fraction < 1.5) return power;
  if (fraction < 3.5) return 2 * power;
  if (fraction < 7.5) return 5 * power;
  return 10 * power;
}

std::vector<double> Ticks(double lo, double hi, double step) {
  std::vector<double> ticks;
  const double first = std::ceil(lo / step - 1e-9);
  const double last = std::floor(hi / step + 1e-9);
  for (double i = first; i <= last; ++i) ticks.push_back(i * step);
  return ticks;
}

// Tick labels with as many digits as the spacing needs; scientific notation for spacings below
// 1e-3 and values from 1e7.
std::vector<std::string> TickLabels(const std::vector<double>& ticks, double step) {
  double max_abs = 0;
  for (double tick : ticks) max_abs = std::max(max_abs, std::abs(tick));
  const int step_exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  std::vector<std::string> labels;
  for (double tick : ticks) {
    if (std::abs(tick) < step * 1e-6) {
      labels.push_back("0");
    } else if (step >= 1e-3 && max_abs < 1e7) {
      labels.push_back(absl::StrFormat("%.*f", std::max(0, -step_exponent), tick));
    } else {
      const int max_exponent = static_cast<int>(std::floor(std::log10(max_abs) + 1e-9));
      const int digits = std::clamp(max_exponent - step_exponent, 0, 3);
      labels.push_back(absl::StrFormat("%.*e", digits, tick));
    }
  }
  return labels;
}

// [lo, hi] of the finite values, widened when empty or a single value.
std::pair<double, double> Range(const std::vector<double>& values) {
  double lo = INFINITY;
  double hi = -INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) return {0.0, 1.0};
  if (lo == hi) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    return {lo - pad, hi + pad};
  }
  return {lo, hi};
}

// Points in screen coordinates, split where a value is not finite.
using Segment = std::vector<std::pair<double, double>>;

// Keeps, per pixel column, the first, lowest, highest and last point, in order, so a long
// run draws the same shape with at most four points per pixel.
Segment Decimate(const Segment& points) {
  if (points.size() <= 4 * static_cast<size_t>(kRight - kLeft)) return points;
  Segment out;
  size_t begin = 0;
  while (begin < points.size()) {
    size_t end = begin;
    const double column = std::floor(points[begin].first);
    size_t low = begin;
    size_t high = begin;
    while (end < points.size() && std::floor(points[end].first) == column) {
      if (points[end].second > points[low].second) low = end;  // screen y grows downwards
      if (points[end].second < points[high].second) high = end;
      ++end;
    }
    size_t keep[] = {begin, std::min(low, high), std::max(low, high), end - 1};
    for (size_t i = 0; i < 4; ++i) {
      if (i == 0 || keep[i] != keep[i - 1]) out.push_back(points[keep[i]]);
    }
    begin = end;
  }
  return out;
}

std::vector<Segment> Segments(const Panel& panel, const std::vector<StepMetrics>& metrics,
                              const std::vector<std::optional<double>>& values) {
  std::vector<Segment> segments(1);
  for (size_t i = 0; i < metrics.size(); ++i) {
    if (!values[i].has_value()) continue;
    if (!std::isfinite(*values[i])) {
      if (!segments.back().empty()) segments.emplace_back();
      continue;
    }
    segments.back().emplace_back(panel.X(static_cast<double>(metrics[i].step)),
                                 panel.Y(*values[i]));
  }
  if (segments.back().empty()) segments.pop_back();
  for (Segment& segment : segments) segment = Decimate(segment);
  return segments;
}

void AppendSeries(const std::vector<Segment>& segments, absl::string_view name,
                  absl::string_view color, bool markers, std::string& svg) {
  for (const Segment& segment : segments) {
    absl::StrAppend(&svg, "<polyline class=\"", name, "\" fill=\"none\" stroke=\"", color,
                    "\" stroke-width=\"1.5\" points=\"");
    for (size_t i = 0; i < segment.size(); ++i) {
      absl::StrAppend(&svg, i == 0 ? "" : " ",
                      absl::StrFormat("%.1f,%.1f", segment[i].first, segment[i].second));
    }
    absl::StrAppend(&svg, "\"/>\n");
    if (!markers && segment.size() > 1) continue;  // a lone point would not show otherwise
    for (const auto& [x, y] : segment) {
      absl::StrAppend(
          &svg,
          absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, color));
    }
  }
}

// Frame, grid, tick labels and y-axis title of one panel.
void AppendAxes(const Panel& panel, double x_step, double y_step, absl::string_view y_title,
                std::string& svg) {
  const std::vector<double> x_ticks = Ticks(panel.x_min, panel.x_max, x_step);
  const std::vector<std::string> x_labels = TickLabels(x_ticks, x_step);
  for (size_t i = 0; i < x_ticks.size(); ++i) {
    const double x = panel.X(x_ticks[i]);
    absl::StrAppend(
        &svg, absl::StrFormat(
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                  x, panel.top, x, panel.bottom, x, panel.bottom + 16, x_labels[i]));
  }
  const std::vector<double> y_ticks = Ticks(panel.y_min, panel.y_max, y_step);
  const std::vector<std::string> y_labels = TickLabels(y_ticks, y_step);
  for (size_t i = 0; i < y_ticks.size(); ++i) {
    const double y = panel.Y(y_ticks[i]);
    absl::StrAppend(
        &svg, absl::StrFormat(
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  kLeft, y, kRight, y, kLeft - 6, y + 4, y_labels[i]));
  }
  absl::StrAppend(&svg,
                  absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                                  "fill=\"none\" stroke=\"#333\"/>\n",
                                  kLeft, panel.top, kRight - kLeft, panel.bottom - panel.top));
  const double middle = (panel.top + panel.bottom) / 2;
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"20\" y=\"%.1f\" text-anchor=\"middle\" "
                                        "transform=\"rotate(-90 20 %.1f)\">%s</text>\n",
                                        middle, middle, y_title));
}

// A one-row legend above the panel's top left corner, outside the plotted area.
void AppendLegend(const Panel& panel, const std::vector<std::pair<std::string, std::string>>& items,
                  std::string& svg) {
  double x = kLeft;
  const double y = panel.top - 8;
  for (const auto& [name, color] : items) {
    absl::StrAppend(
        &svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                              "stroke-width=\"2\"/>\n<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                              x, y - 4, x + 24, y - 4, color, x + 30, y, name));
    x += 30 + 7.0 * name.size() + 24;
  }
}

Panel MakePanel(double top, double bottom, std::pair<double, double> x_range,
                const std::vector<double>& values, double& y_step) {
  auto [y_lo, y_hi] = Range(values);
  y_step = NiceStep(y_hi - y_lo, 5);
  return Panel{top,
               bottom,
               x_range.first,
               x_range.second,
               std::floor(y_lo / y_step) * y_step,
               std::ceil(y_hi / y_step) * y_step};
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

uint32_t Crc32c(absl::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = (crc >> 8) ^ kCrc32cTable.entries[(crc ^ byte) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// --- JsonlWriter ---

absl::StatusOr<JsonlWriter> JsonlWriter::Create(const std::string& path, bool append) {
  const int flags = O_CREAT | O_CLOEXEC | (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return SystemError("cannot open metrics file", path);
  if (append) {
    if (absl::Status status = TrimPartialLine(fd, path); !status.ok()) {
      CloseFd(fd);
      return status;
    }
  }
  return JsonlWriter(path, fd);
}

JsonlWriter::JsonlWriter(JsonlWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

JsonlWriter& JsonlWriter::operator=(JsonlWriter&& other) noexcept {
  if (this != &other) {
    CloseFd(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

JsonlWriter::~JsonlWriter() { CloseFd(fd_); }

absl::Status JsonlWriter::Write(const StepMetrics& metrics) {
  return WriteAll(fd_, absl::StrCat(base::WriteJsonFields(metrics).dump(), "\n"), path_);
}

absl::StatusOr<std::vector<StepMetrics>> ReadJsonl(const std::string& path) {
  KEEL_ASSIGN_OR_RETURN(const std::string contents, ReadFile(path));
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
      if (!std::is_same_v<Field, std::optional<double>> && missing.empty() &&
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

// --- TensorBoardWriter ---

absl::StatusOr<TensorBoardWriter> TensorBoardWriter::Create(const std::string& dir,
                                                            double wall_time) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return SystemError("cannot create TensorBoard directory", dir);
  }
  const std::string base = absl::StrCat(dir, "/events.out.tfevents.",
                                        static_cast<int64_t>(wall_time), ".", HostName(), ".keel");
  std::string path = base;
  int fd = -1;
  for (int suffix = 1;; ++suffix) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) break;
    if (errno != EEXIST || suffix > 1000) return SystemError("cannot create event file", path);
    path = absl::StrCat(base, ".", suffix);
  }
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version("brain.Event:2");
  if (absl::Status status = WriteEvent(fd, event, path); !status.ok()) {
    CloseFd(fd);
    ::unlink(path.c_str());
    return status;
  }
  return TensorBoardWriter(path, fd);
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    CloseFd(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

TensorBoardWriter::~TensorBoardWriter() { CloseFd(fd_); }

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
  return WriteEvent(fd_, event, path_);
}

absl::Status TensorBoardWriter::Flush() {
  if (::fsync(fd_) != 0) return SystemError("cannot fsync", path_);
  return absl::OkStatus();
}

// --- Plot ---

absl::Status WriteLossPlot(const std::string& path, const std::vector<StepMetrics>& metrics) {
  if (metrics.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot plot ", path, ": metrics is empty (need at least one step)"));
  }
  std::vector<double> steps;
  std::vector<std::optional<double>> loss;
  std::vector<std::optional<double>> val_loss;
  std::vector<std::optional<double>> lr;
  std::vector<double> loss_values;
  std::vector<double> lr_values;
  bool has_val_loss = false;
  for (const StepMetrics& m : metrics) {
    steps.push_back(static_cast<double>(m.step));
    loss.push_back(m.loss);
    val_loss.push_back(m.val_loss);
    lr.push_back(m.lr);
    loss_values.push_back(m.loss);
    if (m.val_loss.has_value()) {
      loss_values.push_back(*m.val_loss);
      has_val_loss = true;
    }
    lr_values.push_back(m.lr);
  }
  auto x_range = Range(steps);
  if (metrics.size() == 1) x_range = {steps[0] - 1, steps[0] + 1};
  const double x_step = std::max(1.0, NiceStep(x_range.second - x_range.first, 6));

  double loss_step = 0;
  double lr_step = 0;
  const Panel loss_panel = MakePanel(66, 336, x_range, loss_values, loss_step);
  const Panel lr_panel = MakePanel(396, 546, x_range, lr_values, lr_step);

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
      "Training loss and learning rate, steps %d to %d</text>\n",
      kWidth, kHeight, kWidth, kHeight, kWidth / 2, metrics.front().step, metrics.back().step);
  AppendAxes(loss_panel, x_step, loss_step, "loss", svg);
  AppendSeries(Segments(loss_panel, metrics, loss), "loss", "#1f77b4", /*markers=*/false, svg);
  std::vector<std::pair<std::string, std::string>> loss_legend = {{"training loss", "#1f77b4"}};
  if (has_val_loss) {
    AppendSeries(Segments(loss_panel, metrics, val_loss), "val_loss", "#ff7f0e",
                 /*markers=*/true, svg);
    loss_legend.emplace_back("validation loss", "#ff7f0e");
  }
  AppendLegend(loss_panel, loss_legend, svg);

  AppendAxes(lr_panel, x_step, lr_step, "learning rate", svg);
  AppendSeries(Segments(lr_panel, metrics, lr), "lr", "#2ca02c", /*markers=*/false, svg);
  AppendLegend(lr_panel, {{"learning rate", "#2ca02c"}}, svg);
  absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                                        "step</text>\n</svg>\n",
                                        (kLeft + kRight) / 2, lr_panel.bottom + 36));

  const std::string temporary = absl::StrCat(path, ".tmp");
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("cannot create plot file", temporary);
  absl::Status status = WriteAll(fd, svg, temporary);
  if (::close(fd) != 0 && status.ok()) status = SystemError("cannot close", temporary);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = SystemError(absl::StrCat("cannot rename ", temporary, " to"), path);
  }
  if (!status.ok()) ::unlink(temporary.c_str());
  return status;
}

// --- Progress ---

std::string ProgressLine(const StepMetrics& metrics, int64_t max_steps, int64_t start_step) {
  std::string line;
  if (max_steps > 0) {
    const int width = static_cast<int>(absl::StrCat(max_steps).size());
    line = absl::StrFormat("step %*d/%d", width, metrics.step, max_steps);
  } else {
    line = absl::StrFormat("step %d", metrics.step);
  }
  absl::StrAppend(
      &line, absl::StrFormat(" | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s", metrics.loss,
                             metrics.lr, metrics.grad_norm, Throughput(metrics.tokens_per_second)));
  if (metrics.val_loss.has_value()) {
    absl::StrAppend(&line, absl::StrFormat(" | val loss %.4f", *metrics.val_loss));
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

}  // namespace keel::tools
