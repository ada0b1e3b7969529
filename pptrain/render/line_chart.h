// A line chart as an SVG picture: series of values at x = 1, 2, ... (a training run's loss per
// step), each a coloured polyline with its legend entry on the right, over grid lines at round
// values. `pptrain compare` draws its losses.svg with it.
//
//   LineChartOptions options;
//   options.title = "Training loss per step";
//   options.x_label = "step";
//   options.y_label = "loss";
//   options.x_count = 300;
//   std::string svg = render_line_chart({{"1f1b", losses, line_chart_colour(0)}}, options);
//
// The picture is 960 x 540 px, its plot area 70 .. 720 x 40 .. 480 px; the y axis runs from a
// round value at or below the lowest finite value to one at or above the highest.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace pptrain {

struct LineSeries {
  std::string label;           // its legend entry
  std::vector<double> values;  // the value at x = 1, 2, ...; a non-finite one is left out
  std::string colour;          // an SVG colour: "#1f77b4", "black"
  bool dashed = false;         // a dashed line shows a series drawn over another
};

struct LineChartOptions {
  std::string title;    // above the plot
  std::string x_label;  // under the x axis
  std::string y_label;  // beside the y axis
  int x_count = 2;      // the x axis runs from 1 to max(x_count, 2)
};

std::string render_line_chart(const std::vector<LineSeries>& series,
                              const LineChartOptions& options);

// The colour of the `index`-th series: matplotlib's ten, then five darker ones, then again.
const char* line_chart_colour(size_t index);

}  // namespace pptrain
