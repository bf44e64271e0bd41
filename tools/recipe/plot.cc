#include "tools/recipe/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/files.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

constexpr double kWidth = 800;
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

std::vector<Segment> Segments(const Panel& panel, const std::vector<double>& x,
                              const std::vector<std::optional<double>>& values) {
  std::vector<Segment> segments(1);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!values[i].has_value()) continue;
    if (!std::isfinite(*values[i])) {
      if (!segments.back().empty()) segments.emplace_back();
      continue;
    }
    segments.back().emplace_back(panel.X(x[i]), panel.Y(*values[i]));
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

Panel MakePanel(double top, const PlotPanel& spec, std::pair<double, double> x_range,
                double& y_step) {
  std::vector<double> values;
  for (const PlotSeries& series : spec.series) {
    for (const std::optional<double>& y : series.y) {
      if (y.has_value()) values.push_back(*y);
    }
  }
  auto [y_lo, y_hi] = Range(values);
  y_step = NiceStep(y_hi - y_lo, 5);
  return Panel{top,
               top + spec.height,
               x_range.first,
               x_range.second,
               std::floor(y_lo / y_step) * y_step,
               std::ceil(y_hi / y_step) * y_step};
}

absl::Status CheckPlot(const Plot& plot) {
  if (plot.x.empty() || plot.panels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("plot \"", plot.title, "\" has ", plot.x.size(),
                                                   " x positions and ", plot.panels.size(),
                                                   " panels; needs both"));
  }
  for (const PlotPanel& panel : plot.panels) {
    for (const PlotSeries& series : panel.series) {
      if (series.y.size() != plot.x.size()) {
        return absl::InvalidArgumentError(absl::StrCat("plot series \"", series.legend, "\" has ",
                                                       series.y.size(), " values for ",
                                                       plot.x.size(), " x positions"));
      }
    }
  }
  return absl::OkStatus();
}

// Panels start below the title and are this far apart (room for tick labels and legends).
constexpr double kFirstPanelTop = 66;
constexpr double kPanelGap = 60;
constexpr double kBottomMargin = 54;

}  // namespace

absl::StatusOr<std::string> RenderSvg(const Plot& plot) {
  KEEL_RETURN_IF_ERROR(CheckPlot(plot));
  auto x_range = Range(plot.x);
  if (plot.x.size() == 1) x_range = {plot.x[0] - 1, plot.x[0] + 1};
  const double x_step = std::max(1.0, NiceStep(x_range.second - x_range.first, 6));
  std::vector<Panel> panels;
  std::vector<double> y_steps(plot.panels.size());
  double top = kFirstPanelTop;
  for (size_t p = 0; p < plot.panels.size(); ++p) {
    panels.push_back(MakePanel(top, plot.panels[p], x_range, y_steps[p]));
    top = panels.back().bottom + kPanelGap;
  }
  const double height = panels.back().bottom + kBottomMargin;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">%s</text>\n",
      kWidth, height, kWidth, height, kWidth / 2, plot.title);
  for (size_t p = 0; p < panels.size(); ++p) {
    AppendAxes(panels[p], x_step, y_steps[p], plot.panels[p].y_title, svg);
    std::vector<std::pair<std::string, std::string>> legend;
    for (const PlotSeries& series : plot.panels[p].series) {
      AppendSeries(Segments(panels[p], plot.x, series.y), series.css_class, series.color,
                   series.markers, svg);
      legend.emplace_back(series.legend, series.color);
    }
    AppendLegend(panels[p], legend, svg);
  }
  absl::StrAppend(&svg,
                  absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                                  "%s</text>\n</svg>\n",
                                  (kLeft + kRight) / 2, panels.back().bottom + 36, plot.x_title));
  return svg;
}

absl::Status WritePlot(const std::string& path, const Plot& plot) {
  KEEL_ASSIGN_OR_RETURN(const std::string svg, RenderSvg(plot));
  const std::string temporary = absl::StrCat(path, ".tmp");
  absl::Status status = base::WriteFile(temporary, svg);
  if (status.ok()) status = base::RenameDurably(temporary, path);
  if (!status.ok()) base::RemoveTree(temporary).IgnoreError();
  return status;
}

absl::Status WriteLossPlot(const std::string& path, const std::vector<StepMetrics>& metrics) {
  if (metrics.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot plot ", path, ": metrics is empty (need at least one step)"));
  }
  Plot plot;
  plot.title = absl::StrFormat("Training loss and learning rate, steps %d to %d",
                               metrics.front().step, metrics.back().step);
  plot.x_title = "step";
  PlotSeries loss{"training loss", "loss", "#1f77b4", {}, /*markers=*/false};
  PlotSeries val_loss{"validation loss", "val_loss", "#ff7f0e", {}, /*markers=*/true};
  PlotSeries lr{"learning rate", "lr", "#2ca02c", {}, /*markers=*/false};
  bool has_val_loss = false;
  for (const StepMetrics& m : metrics) {
    plot.x.push_back(static_cast<double>(m.step));
    loss.y.push_back(m.loss);
    val_loss.y.push_back(m.val_loss);
    lr.y.push_back(m.lr);
    has_val_loss = has_val_loss || m.val_loss.has_value();
  }
  PlotPanel losses{"loss", 270, {std::move(loss)}};
  if (has_val_loss) losses.series.push_back(std::move(val_loss));
  plot.panels = {std::move(losses), PlotPanel{"learning rate", 150, {std::move(lr)}}};
  return WritePlot(path, plot);
}

}  // namespace keel::tools::recipe
