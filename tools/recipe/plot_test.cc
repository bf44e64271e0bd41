#include "tools/recipe/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"

namespace keel::tools::recipe {
namespace {

using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

StepMetrics Point(int64_t step, double loss, double lr) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = lr;
  return m;
}

// Checks that every start tag has its end tag, in order, and that nothing follows the root.
void ExpectWellFormed(const std::string& svg) {
  std::vector<std::string> open;
  size_t pos = 0;
  bool closed_root = false;
  while ((pos = svg.find('<', pos)) != std::string::npos) {
    ASSERT_FALSE(closed_root) << "content after </svg> at " << pos;
    const size_t end = svg.find('>', pos);
    ASSERT_NE(end, std::string::npos) << "unterminated tag at " << pos;
    const std::string tag = svg.substr(pos + 1, end - pos - 1);
    pos = end + 1;
    if (tag.empty()) FAIL() << "empty tag";
    if (tag.back() == '/') continue;  // self-closing
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find(' ') - (tag[0] == '/'));
    if (tag[0] == '/') {
      ASSERT_FALSE(open.empty()) << "</" << name << "> closes nothing";
      ASSERT_EQ(open.back(), name);
      open.pop_back();
      closed_root = open.empty();
    } else {
      open.push_back(name);
    }
  }
  EXPECT_TRUE(open.empty());
  EXPECT_TRUE(closed_root);
}

TEST(WriteLossPlotTest, WritesWellFormedSvgWithEverySeries) {
  const std::string dir = NewTempDir("plot");
  const std::string path = absl::StrCat(dir, "/loss.svg");
  std::vector<StepMetrics> history;
  for (int64_t step = 1; step <= 200; ++step) {
    StepMetrics m = Point(step, 4.0 / std::sqrt(static_cast<double>(step)), 3e-4 * step / 200);
    if (step % 50 == 0) m.val_loss = m.loss + 0.1;
    history.push_back(m);
  }
  history[100].loss = std::numeric_limits<double>::quiet_NaN();  // a gap, not a point
  KEEL_ASSERT_OK(WriteLossPlot(path, history));

  const std::string svg = ReadFileOrFail(path);
  EXPECT_THAT(svg, StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  ExpectWellFormed(svg);
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"loss\""));
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"lr\""));
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"val_loss\""));
  EXPECT_THAT(svg, HasSubstr("training loss"));
  EXPECT_THAT(svg, HasSubstr("validation loss"));
  EXPECT_THAT(svg, HasSubstr("learning rate"));
  EXPECT_THAT(svg, HasSubstr("steps 1 to 200"));
  EXPECT_THAT(svg, HasSubstr(">3.0e-04<"));  // an lr tick label
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // The NaN splits the training-loss line in two.
  size_t loss_lines = 0;
  for (size_t pos = 0; (pos = svg.find("class=\"loss\"", pos)) != std::string::npos; ++pos) {
    ++loss_lines;
  }
  EXPECT_EQ(loss_lines, 2u);
}

TEST(WriteLossPlotTest, SinglePointAndNoValidationLoss) {
  const std::string path = absl::StrCat(NewTempDir("plot_single"), "/loss.svg");
  KEEL_ASSERT_OK(WriteLossPlot(path, {Point(10, 2.0, 1e-4)}));
  const std::string svg = ReadFileOrFail(path);
  ExpectWellFormed(svg);
  EXPECT_THAT(svg, HasSubstr("<polyline class=\"lr\""));
  EXPECT_THAT(svg, HasSubstr("<circle"));  // a one-point line would be invisible
  EXPECT_THAT(svg, Not(HasSubstr("validation loss")));
}

TEST(WriteLossPlotTest, LongRunsKeepAtMostFourPointsPerPixelColumn) {
  const std::string path = absl::StrCat(NewTempDir("plot_long"), "/loss.svg");
  std::vector<StepMetrics> history;
  for (int64_t step = 1; step <= 100000; ++step) {
    history.push_back(Point(step, 1.0 + static_cast<double>(step % 7), 1e-4));
  }
  history.back().loss = 1e30;  // a diverged last step still gets readable tick labels
  KEEL_ASSERT_OK(WriteLossPlot(path, history));
  const std::string svg = ReadFileOrFail(path);
  ExpectWellFormed(svg);
  const size_t start = svg.find("<polyline class=\"loss\"");
  ASSERT_NE(start, std::string::npos);
  const std::string line = svg.substr(start, svg.find("/>", start) - start);
  // The plot area is 680 pixels wide: 4 * 681 columns at most.
  EXPECT_LE(std::count(line.begin(), line.end(), ','), 4 * 681);
  EXPECT_TRUE(absl::StrContains(svg, ">1.0e+30<"));  // not 31 digits
  EXPECT_TRUE(absl::StrContains(svg, ">100000<"));
}

TEST(WriteLossPlotTest, Errors) {
  const std::string dir = NewTempDir("plot_errors");
  EXPECT_THAT(WriteLossPlot(absl::StrCat(dir, "/empty.svg"), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("metrics is empty")));
  const std::string path = absl::StrCat(dir, "/no_such_dir/loss.svg");
  EXPECT_THAT(WriteLossPlot(path, {Point(1, 2.0, 1e-4)}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST(RenderSvgTest, RefusesPlotsItCannotDraw) {
  Plot plot;
  plot.title = "empty";
  EXPECT_THAT(RenderSvg(plot),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 x positions")));
  plot.x = {1, 2, 3};
  plot.panels = {PlotPanel{"lr", 150, {PlotSeries{"lr", "lr", "#000", {1.0, 2.0}, false}}}};
  EXPECT_THAT(RenderSvg(plot),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 values for 3 x")));
}

TEST(RenderSvgTest, StacksAnyNumberOfPanels) {
  Plot plot;
  plot.title = "three panels";
  plot.x_title = "step";
  plot.x = {1, 2, 3};
  for (const char* name : {"a", "b", "c"}) {
    plot.panels.push_back(PlotPanel{name, 100, {PlotSeries{name, name, "#000", {1.0, 2.0, 4.0}}}});
  }
  KEEL_ASSERT_OK_AND_ASSIGN(const std::string svg, RenderSvg(plot));
  ExpectWellFormed(svg);
  for (const char* name : {"a", "b", "c"}) {
    EXPECT_THAT(svg, HasSubstr(absl::StrCat("<polyline class=\"", name, "\"")));
  }
  // Three 100-pixel panels 60 apart from y = 66, and a 54-pixel margin: 66 + 3 * 100 + 2 * 60
  // + 54 = 540.
  EXPECT_THAT(svg, HasSubstr("height=\"540\""));
}

}  // namespace
}  // namespace keel::tools::recipe
