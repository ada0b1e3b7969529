#include "pptrain/render/line_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "pptrain/render/svg.h"

namespace pptrain {
namespace {

// The picture and its plot area, px.
constexpr double kWidth = 960, kHeight = 540;
constexpr double kLeft = 70, kRight = 720, kTop = 40, kBottom = 480;

constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
                                    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"};

std::string px(double value) {
  return detail::fixed1(value);
}

// Ticks at 1, 2 or 5 x 10^k (at least `min_step` apart) covering [low, high], about `count`
// of them.
std::vector<double> nice_ticks(double low, double high, int count, double min_step = 0) {
  const double span = std::max(high - low, 1e-12);
  const double raw = std::max(span / count, min_step);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    step = factor * power;
    if (step >= raw * (1 - 1e-9)) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(low / step - 1e-9) * step; t <= high + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// A tick's label with as many decimals as the ticks' spacing needs.
std::string tick_label(double value, const std::vector<double>& ticks) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

// The y axis's ticks: round values from one at or below the lowest finite value to one at or
// above the highest (0 .. 1 without any).
std::vector<double> y_ticks_of(const std::vector<LineSeries>& series) {
  double low = 0, high = 1;
  bool first = true;
  for (const LineSeries& s : series) {
    for (double v : s.values) {
      if (!std::isfinite(v)) continue;
      low = first ? v : std::min(low, v);
      high = first ? v : std::max(high, v);
      first = false;
    }
  }
  if (high - low < 1e-9) {
    low -= 0.5;
    high += 0.5;
  }
  std::vector<double> ticks = nice_ticks(low, high, 6);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : high - low;
  if (ticks.empty() || ticks.front() > low + 1e-9 * step) {
    ticks.insert(ticks.begin(), (ticks.empty() ? high : ticks.front()) - step);
  }
  if (ticks.back() < high - 1e-9 * step) ticks.push_back(ticks.back() + step);
  return ticks;
}

// A line from (x1, y1) to (x2, y2) with the rest of its attributes.
std::string line(double x1, double y1, double x2, double y2, const std::string& rest) {
  return "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
         "\" " + rest + "/>\n";
}

const char* dash(const LineSeries& s) {
  return s.dashed ? " stroke-dasharray=\"6 3\"" : "";
}

}  // namespace

const char* line_chart_colour(size_t index) {
  return kColours[index % std::size(kColours)];
}

std::string render_line_chart(const std::vector<LineSeries>& series,
                              const LineChartOptions& options) {
  const std::vector<double> y_ticks = y_ticks_of(series);
  const double low = y_ticks.front(), high = y_ticks.back();
  const double x_max = std::max(options.x_count, 2);
  const auto x = [&](double at) { return kLeft + (at - 1) / (x_max - 1) * (kRight - kLeft); };
  const auto y = [&](double value) {
    return kBottom - (value - low) / (high - low) * (kBottom - kTop);
  };
  const std::string middle = px((kLeft + kRight) / 2);
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(kWidth) +
                    "\" height=\"" + px(kHeight) +
                    "\" font-family=\"sans-serif\" font-size=\"12\">\n"
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + middle + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
         detail::xml_escape(options.title) + "</text>\n";
  // Axes, ticks and grid lines.
  out += line(kLeft, kBottom, kRight, kBottom, "stroke=\"black\"");
  out += line(kLeft, kTop, kLeft, kBottom, "stroke=\"black\"");
  for (double t : y_ticks) {
    out += line(kLeft - 5, y(t), kRight, y(t), "stroke=\"#ddd\"");
    out += "<text x=\"" + px(kLeft - 8) + "\" y=\"" + px(y(t) + 4) + "\" text-anchor=\"end\">" +
           tick_label(t, y_ticks) + "</text>\n";
  }
  for (double t : nice_ticks(1, x_max, 8, /*min_step=*/1)) {
    if (t < 1) continue;
    out += line(x(t), kBottom, x(t), kBottom + 5, "stroke=\"black\"");
    out += "<text x=\"" + px(x(t)) + "\" y=\"" + px(kBottom + 18) + "\" text-anchor=\"middle\">" +
           std::to_string(static_cast<long long>(t)) + "</text>\n";
  }
  out += "<text x=\"" + middle + "\" y=\"" + px(kBottom + 40) + "\" text-anchor=\"middle\">" +
         detail::xml_escape(options.x_label) + "</text>\n";
  const std::string centre = px((kTop + kBottom) / 2);
  out += "<text x=\"18\" y=\"" + centre + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " +
         centre + ")\">" + detail::xml_escape(options.y_label) + "</text>\n";
  // One polyline and one legend entry per series.
  for (size_t i = 0; i < series.size(); ++i) {
    const LineSeries& s = series[i];
    out += "<polyline fill=\"none\" stroke=\"" + s.colour + "\" stroke-width=\"1.5\"" + dash(s) +
           " points=\"";
    for (size_t k = 0; k < s.values.size(); ++k) {
      const double v = s.values[k];
      if (std::isfinite(v)) out += px(x(static_cast<double>(k + 1))) + "," + px(y(v)) + " ";
    }
    out += "\"/>\n";
    const double legend_y = kTop + 10 + 20 * static_cast<double>(i);
    out += line(kRight + 20, legend_y, kRight + 50, legend_y,
                "stroke=\"" + s.colour + "\" stroke-width=\"2\"" + dash(s));
    out += "<text x=\"" + px(kRight + 58) + "\" y=\"" + px(legend_y + 4) + "\">" +
           detail::xml_escape(s.label) + "</text>\n";
  }
  out += "</svg>\n";
  return out;
}

}  // namespace pptrain
