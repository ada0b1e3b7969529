#include "pptrain/render/line_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "pptrain/render/testing.h"

namespace pptrain {
namespace {

using testing::count;

LineChartOptions losses(int steps) {
  LineChartOptions options;
  options.title = "Training loss per step";
  options.x_label = "step";
  options.y_label = "loss";
  options.x_count = steps;
  return options;
}

TEST(LineChart, OnePolylineAndLegendEntryPerSeries) {
  const std::string svg = render_line_chart(
      {{"a", {9, 8, 7, 6}, line_chart_colour(0)}, {"b <&>", {9, 8.5, 8, 7.5}, "black", true}},
      losses(4));
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960.0\"", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 2u);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"6 3\""), 2u);  // b's line and its legend entry
  EXPECT_NE(svg.find(">b &lt;&amp;&gt;</text>"), std::string::npos);
  // Steps 1 and 4 at the plot's ends; loss 9 at the top tick, 6 on the axis.
  EXPECT_NE(svg.find("points=\"70.0,40.0 286.7,186.7 503.3,333.3 720.0,480.0 \""),
            std::string::npos)
      << svg;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(LineChart, YAxisSpansRoundValuesAroundTheFiniteOnes) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg =
      render_line_chart({{"a", {2.3, nan, 1.1}, line_chart_colour(1)}}, losses(3));
  // Ticks every 0.2 from 1.0 to 2.4, labelled with one decimal.
  EXPECT_NE(svg.find("text-anchor=\"end\">1.0</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("text-anchor=\"end\">2.4</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("text-anchor=\"end\">2.6</text>"), std::string::npos) << svg;
  // The NaN of step 2 is left out of the line.
  const size_t points = svg.find("points=\"");
  const std::string line = svg.substr(points, svg.find('"', points + 8) - points);
  EXPECT_EQ(count(line, ","), 2u) << line;
}

TEST(LineChart, WithoutSeriesItIsAnEmptyPlot) {
  const std::string svg = render_line_chart({}, losses(1));
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
}

TEST(LineChart, ColoursRepeatAfterFifteen) {
  EXPECT_STREQ(line_chart_colour(0), "#1f77b4");
  EXPECT_STREQ(line_chart_colour(15), line_chart_colour(0));
}

}  // namespace
}  // namespace pptrain
