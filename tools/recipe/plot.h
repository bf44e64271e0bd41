// SVG line plots for a run directory: panels stacked over one shared x axis, each with a frame,
// grid, tick labels, a y-axis title and a legend. Long series keep at most four points per
// pixel column (first, lowest, highest, last), so a million steps draw the same shape.
//
//   Plot plot{"Learning rate", "step", steps, {{"lr", 150, {{"lr", "lr", "#2ca02c", lrs}}}}};
//   KEEL_RETURN_IF_ERROR(WritePlot(run_dir + "/schedule.svg", plot));
#ifndef KEEL_TOOLS_RECIPE_PLOT_H_
#define KEEL_TOOLS_RECIPE_PLOT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/recipe/metrics.h"

namespace keel::tools::recipe {

// One line of a panel.
struct PlotSeries {
  // Legend text, and the SVG class of the line's elements.
  std::string legend;
  std::string css_class;
  std::string color;
  // One value per x position: nullopt draws nothing there, a non-finite value breaks the line.
  std::vector<std::optional<double>> y;
  // Draws every point as a dot (for sparse series); a lone point always gets one.
  bool markers = false;
};

struct PlotPanel {
  std::string y_title;
  // Height of the plotted area in pixels.
  double height = 150;
  std::vector<PlotSeries> series;
};

struct Plot {
  std::string title;
  std::string x_title;
  // The shared x positions, increasing.
  std::vector<double> x;
  std::vector<PlotPanel> panels;
};

// The SVG document of `plot`. Errors: kInvalidArgument for no x positions, no panels, or a
// series whose length differs from x's.
[[nodiscard]] absl::StatusOr<std::string> RenderSvg(const Plot& plot);

// Renders `plot` into `path`, written to a temporary file and renamed onto it.
// Errors: as RenderSvg; base::ErrnoCode's naming the file.
[[nodiscard]] absl::Status WritePlot(const std::string& path, const Plot& plot);

// The trainer's loss.svg: training loss (and validation loss points where present) above the
// learning rate, over the steps. Non-finite values are left out.
// Errors: kInvalidArgument if `metrics` is empty; as WritePlot.
[[nodiscard]] absl::Status WriteLossPlot(const std::string& path,
                                         const std::vector<StepMetrics>& metrics);

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_PLOT_H_
