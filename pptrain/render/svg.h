// Timelines as SVG pictures in the style of the pipeline papers' figures: one row per rank, one
// box per action at its start and end, coloured by kind (F, I, W, B; a lighter shade for a
// rank's second and later model chunks), labelled with the microbatch (and the stage, small, when
// ranks hold several stages), with a title, a time axis and a legend. A data-parallel
// all-reduce (REDUCE_GRAD, which runs beside the compute) is a thin purple bar in a lane under
// its rank's row; the lane is there only when the timeline has one.
//
//   std::ofstream("1f1b.svg") << render_svg(simulate(s, costs).timeline);
//   // Measured above predicted, on one time axis:
//   SvgOptions options;
//   options.labels = {"measured", "predicted"};
//   render_svg({measured, predicted}, options);
//
// The output is plain SVG 1.1 that rsvg-convert, browsers and Inkscape read.
#pragma once

#include <string>
#include <vector>

#include "pptrain/schedule/timeline.h"

namespace pptrain {

struct SvgOptions {
  std::string title;                // picture title; empty: the first timeline's title
  std::vector<std::string> labels;  // one per stacked timeline; empty: each timeline's title
                                    // (a single timeline gets no label of its own)
  std::string time_unit;            // shown on the time axis; empty: the first timeline's unit
  double plot_width_px = 1000;      // width of the time axis
  double row_height_px = 22;        // height of one rank's row
  bool show_comms = false;          // draw SEND/RECV events as thin bars under the boxes
  bool shared_time_axis = true;     // stacked timelines use one scale (each starts at its first
                                    // event); false: each fills the plot width
};

std::string render_svg(const Timeline& timeline, const SvgOptions& options = {});
std::string render_svg(const std::vector<Timeline>& timelines, const SvgOptions& options = {});

namespace detail {
// printf's "%.1f" of `value`, as the SVG writes its coordinates (exposed for its test and for
// line_chart.h, which writes its coordinates alike).
std::string fixed1(double value);
// `text` as SVG text or an attribute's value: &, <, > and " escaped.
std::string xml_escape(const std::string& text);
}  // namespace detail

}  // namespace pptrain
