#include "pptrain/render/svg.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// Layout, in pixels.
constexpr double kMarginLeft = 64;  // room for "rank 12"
constexpr double kMarginRight = 24;
constexpr double kTitleHeight = 34;
constexpr double kLabelHeight = 18;  // a stacked timeline's label line
constexpr double kRowGap = 3;
constexpr double kAxisHeight = 30;  // axis line, ticks and their numbers
constexpr double kPanelGap = 10;
constexpr double kLegendHeight = 26;
constexpr double kCommHeight = 4;  // thin bar for a SEND/RECV when shown
constexpr double kCommMinWidth = 2;
// A REDUCE_GRAD (data-parallel all-reduce) runs beside the compute, so it gets a lane of its own
// under its rank's row rather than covering the boxes it overlaps.
constexpr double kReduceLane = 8;
constexpr double kReduceHeight = 6;
constexpr const char* kReduceColour = "#8e44ad";
constexpr const char* kSkipColour = "#c0392b";  // a skip connection's messages
// What the SVG reserves for its text: per event (a box with its tooltip and label: 150 to 250
// bytes), and for the head and what else is not an event.
constexpr size_t kBytesPerEvent = 256;
constexpr size_t kHeadBytes = 16384;

// printf's "%.6g" and "%.1f" (std::to_chars is specified as printf in the C locale), without
// its locale and formatting machinery: a large timeline has tens of thousands of numbers.
std::string fmt(double value) {
  char buffer[32];
  const auto end =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::general, 6);
  return std::string(buffer, end.ptr);
}
std::string px(double value) {
  return detail::fixed1(value);
}

std::string escape(const std::string& text) {
  return detail::xml_escape(text);
}

struct Rgb {
  int r, g, b;
};

// Colours close to the papers' figures: forward blue, backward-for-input orange, backward-for-
// weights green, full backward teal.
Rgb base_colour(Op op) {
  switch (op) {
    case Op::F:
      return {86, 140, 214};
    case Op::I:
      return {236, 140, 64};
    case Op::W:
      return {104, 178, 92};
    case Op::B:
      return {58, 166, 160};
    default:
      return {130, 130, 130};  // communication
  }
}

// A rank's later model chunks (interleaved, V-shape) get lighter shades of the same colour.
std::string colour(Op op, int chunk) {
  const Rgb c = base_colour(op);
  const double white = std::min(0.6, 0.42 * chunk);
  const auto mix = [&](int v) { return static_cast<int>(std::lround(v + (255 - v) * white)); };
  constexpr char kHex[] = "0123456789abcdef";
  std::string out = "#";
  for (const int v : {mix(c.r), mix(c.g), mix(c.b)}) {  // 0 .. 255: two digits, as printf's %02x
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

const char* op_description(Op op) {
  switch (op) {
    case Op::F:
      return "F forward";
    case Op::I:
      return "I backward (input)";
    case Op::W:
      return "W backward (weights)";
    case Op::B:
      return "B backward";
    case Op::REDUCE_GRAD:
      return "all-reduce of gradients (--dp)";
    default:
      return "send / receive";
  }
}

// A tick step of 1, 2 or 5 times a power of ten, giving about `target` ticks over `span`.
double tick_step(double span, int target) {
  if (span <= 0) return 1;
  const double raw = span / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0}) {
    if (raw <= factor * power) return factor * power;
  }
  return 10 * power;
}

struct Extent {
  double start = 0, end = 0;
};
Extent extent_of(const Timeline& timeline) {
  if (timeline.events.empty()) return {};
  Extent e{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (const auto& event : timeline.events) {
    e.start = std::min(e.start, event.start);
    e.end = std::max(e.end, event.end);
  }
  return e;
}

bool has_reductions(const Timeline& timeline) {
  for (const auto& event : timeline.events) {
    if (is_collective(event.action.op)) return true;
  }
  return false;
}

// Stages per rank: more stages than ranks means virtual stages (interleaved, V-shape).
// True if some rank runs compute of two stages: more stages than ranks, or replicated stages
// (Chimera's rank r holds stages r and P-1-r), where the stage tells the two apart.
bool ranks_hold_several_stages(const Timeline& timeline) {
  std::vector<int> stage_of(timeline.num_ranks, -1);
  for (const auto& event : timeline.events) {
    if (!is_compute(event.action.op) || event.rank < 0 || event.rank >= timeline.num_ranks)
      continue;
    for (const Action& atom : atoms_of(event.action)) {
      int& seen = stage_of[event.rank];
      if (seen >= 0 && seen != atom.stage) return true;
      seen = atom.stage;
    }
  }
  return false;
}

int chunks_of(const Timeline& timeline) {
  int stages = 0;
  for (const auto& event : timeline.events) {
    if (event.action.op == Op::OVERLAP_F_B) {
      for (const auto& part : event.action.parts()) stages = std::max(stages, part.stage + 1);
    } else {
      stages = std::max(stages, event.action.stage + 1);
    }
  }
  return timeline.num_ranks > 0
             ? std::max(1, (stages + timeline.num_ranks - 1) / timeline.num_ranks)
             : 1;
}

class SvgWriter {
 public:
  SvgWriter(const std::vector<Timeline>& timelines, const SvgOptions& options)
      : timelines_(timelines), options_(options) {}

  std::string render() {
    PPTRAIN_CHECK(!timelines_.empty(), "render_svg needs at least one timeline");
    PPTRAIN_CHECK(options_.labels.empty() || options_.labels.size() == timelines_.size(),
                  "render_svg got ", options_.labels.size(), " labels for ", timelines_.size(),
                  " timelines; expected one label per timeline or none");
    PPTRAIN_CHECK(options_.plot_width_px > 0 && options_.row_height_px > 0,
                  "render_svg needs a positive plot width and row height");
    double longest = 0;
    for (const auto& t : timelines_) {
      const Extent e = extent_of(t);
      longest = std::max(longest, e.end - e.start);
    }
    const double width = kMarginLeft + options_.plot_width_px + kMarginRight;
    // About what an event's box, tooltip and label take: the body is written once, not regrown.
    size_t events = 0;
    for (const auto& t : timelines_) events += t.events.size();
    body_.reserve(events * kBytesPerEvent + kHeadBytes);

    double y = kTitleHeight;
    for (size_t k = 0; k < timelines_.size(); ++k) {
      const Timeline& t = timelines_[k];
      const std::string label = !options_.labels.empty() ? options_.labels[k]
                                : timelines_.size() > 1  ? t.title
                                                         : "";
      if (!label.empty()) {
        text(kMarginLeft, y + 13, label, "12", "start", "font-weight=\"bold\"");
        y += kLabelHeight;
      }
      const Extent e = extent_of(t);
      const double span = options_.shared_time_axis ? longest : e.end - e.start;
      y = panel(t, e.start, span, y) + kPanelGap;
    }
    y = legend(y);

    const std::string title = options_.title.empty() ? timelines_.front().title : options_.title;
    std::string head = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    head += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" +
            px(y) + "\" viewBox=\"0 0 " + px(width) + " " + px(y) +
            "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
    head += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    head += "<text x=\"" + px(width / 2) + "\" y=\"22\" font-size=\"15\" font-weight=\"bold\" " +
            "text-anchor=\"middle\">" + escape(title) + "</text>\n";
    body_.insert(0, head);  // in place: the body is the large part
    body_ += "</svg>\n";
    return std::move(body_);
  }

 private:
  // Each piece appended to the body in turn: a timeline has tens of thousands of elements, and
  // a chain of `+` makes a new string at every step.
  template <typename... Pieces>
  void append(const Pieces&... pieces) {
    (body_.append(pieces), ...);
  }
  void text(double x, double y, const std::string& content, const char* size, const char* anchor,
            const std::string& extra = "") {
    append("<text x=\"", px(x), "\" y=\"", px(y), "\" font-size=\"", size, "\" text-anchor=\"",
           anchor, "\"");
    if (!extra.empty()) append(" ", extra);
    append(">", escape(content), "</text>\n");
  }
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& css_class, const std::string& tooltip = "") {
    append("<rect class=\"", css_class, "\" x=\"", px(x), "\" y=\"", px(y), "\" width=\"",
           px(std::max(w, 0.5)), "\" height=\"", px(h), "\" fill=\"", fill, "\"");
    if (css_class == "event") append(" stroke=\"#333333\" stroke-width=\"0.6\"");
    // Back-to-back all-reduces of one rank stay two bars.
    if (css_class == "reduce") append(" stroke=\"white\" stroke-width=\"0.8\"");
    if (tooltip.empty()) {
      append("/>\n");
    } else {
      append("><title>", escape(tooltip), "</title></rect>\n");
    }
  }

  // Draws one timeline's rows and time axis from `top`; returns the y below it.
  double panel(const Timeline& t, double t0, double span, double top) {
    const double row = options_.row_height_px;
    const double scale = span > 0 ? options_.plot_width_px / span : 0;  // px per time unit
    const int P = t.num_ranks;
    const int chunks = chunks_of(t);
    const bool several_stages = ranks_hold_several_stages(t);
    const double lane = has_reductions(t) ? kReduceLane : 0;
    const auto x_of = [&](double time) { return kMarginLeft + (time - t0) * scale; };
    const auto y_of = [&](int rank) { return top + rank * (row + lane + kRowGap); };

    for (int r = 0; r < P; ++r) {
      rect(kMarginLeft, y_of(r), options_.plot_width_px, row, "#f2f2f2", "row");
      text(kMarginLeft - 8, y_of(r) + row / 2 + 4, "rank " + std::to_string(r), "11", "end");
    }
    const double font = std::min(11.0, row * 0.55);
    // Compute boxes first, then communication ticks on top of them.
    for (const bool comm_pass : {false, true}) {
      for (const auto& event : t.events) {
        const Op op = event.action.op;
        if (is_comm(op) != comm_pass || (comm_pass && !options_.show_comms)) continue;
        const double x = x_of(event.start), w = (event.end - event.start) * scale;
        const double y = y_of(event.rank);
        std::string tooltip = to_string(event.action);
        tooltip.append(" [")
            .append(fmt(event.start))
            .append(", ")
            .append(fmt(event.end))
            .append("]");
        if (is_collective(op)) {
          if (comm_pass) continue;
          seen_reduce_ = true;
          rect(x, y + row + (lane - kReduceHeight) / 2, std::max(w, kCommMinWidth), kReduceHeight,
               kReduceColour, "reduce", tooltip);
          continue;
        }
        if (is_comm(op)) {
          seen_comm_ = true;
          // Simulated transfers are instants; a minimum width keeps them visible as ticks.
          rect(x, y + row - kCommHeight, std::max(w, kCommMinWidth), kCommHeight, "#333333", "comm",
               tooltip);
          continue;
        }
        seen_ops_[static_cast<int>(op)] = true;
        if (op == Op::OVERLAP_F_B) {
          // One band per overlapped part, stacked in the row.
          const auto& parts = event.action.parts();
          const double band = row / parts.size();
          for (size_t k = 0; k < parts.size(); ++k) {
            seen_ops_[static_cast<int>(parts[k].op)] = true;
            rect(x, y + k * band, w, band, colour(parts[k].op, parts[k].stage / P), "event",
                 tooltip);
          }
          continue;
        }
        const int chunk = event.action.stage / std::max(P, 1);
        rect(x, y, w, row, colour(op, chunk), "event", tooltip);
        label(event.action, x, y, w, font, chunks > 1 || several_stages);
      }
    }

    skip_lines(t, x_of, [&](int rank) { return y_of(rank) + row / 2; });

    // Time axis under the rows.
    const double axis_y = y_of(P) - kRowGap + 4;
    body_ += "<line x1=\"" + px(kMarginLeft) + "\" y1=\"" + px(axis_y) + "\" x2=\"" +
             px(kMarginLeft + options_.plot_width_px) + "\" y2=\"" + px(axis_y) +
             "\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
    const double step = tick_step(span, 10);
    for (int k = 0; span > 0 && k * step <= span * (1 + 1e-9); ++k) {
      const double x = kMarginLeft + k * step * scale;
      body_ += "<line x1=\"" + px(x) + "\" y1=\"" + px(axis_y) + "\" x2=\"" + px(x) + "\" y2=\"" +
               px(axis_y + 4) + "\" stroke=\"#333333\" stroke-width=\"1\"/>\n";
      text(x, axis_y + 15, fmt(k * step), "10", "middle");
    }
    const std::string unit = !options_.time_unit.empty() ? options_.time_unit
                             : timelines_.empty()        ? ""
                                                         : unit_name(timelines_[0].unit);
    if (!unit.empty()) {
      text(kMarginLeft + options_.plot_width_px, axis_y + 27, "time (" + unit + ")", "10", "end",
           "fill=\"#444444\"");
    }
    return axis_y + kAxisHeight;
  }

  // The microbatch number in the box, and when ranks hold several stages the stage in small text
  // above it; whatever does not fit the box is left out.
  void label(const Action& action, double x, double y, double w, double font, bool with_stage) {
    const std::string mb = std::to_string(action.microbatch);
    const double char_px = font * 0.62;
    if (w < mb.size() * char_px + 2) return;
    const double row = options_.row_height_px;
    const bool stage_fits =
        with_stage && row >= 18 && w >= (std::to_string(action.stage).size() + 1) * 7 * 0.62 + 2;
    const double baseline = stage_fits ? y + row - 4 : y + row / 2 + font * 0.36;
    text(x + w / 2, baseline, mb, fmt(font).c_str(), "middle", "fill=\"#111111\"");
    if (stage_fits) {
      text(x + w / 2, y + 8, "s" + std::to_string(action.stage), "7", "middle", "fill=\"#222222\"");
    }
  }

  // A skip connection's message: a dashed line from its send to its receive (solid forwards,
  // dotted for the gradient), whether or not the other transfers are shown.
  template <typename XOf, typename YOf>
  void skip_lines(const Timeline& t, XOf x_of, YOf y_of) {
    std::map<std::tuple<int, int, int, int>, const TimelineEvent*> receives;
    const auto key = [](const Action& a) {
      return std::make_tuple(static_cast<int>(a.op), a.stage, a.microbatch, a.peer);
    };
    for (const auto& e : t.events) {
      if (is_skip_message(e.action) && is_recv(e.action.op)) receives[key(e.action)] = &e;
    }
    for (const auto& send : t.events) {
      if (!is_skip_message(send.action) || !is_send(send.action.op)) continue;
      const auto found = receives.find(key(comm_peer(send.action)));
      if (found == receives.end()) continue;
      const TimelineEvent& recv = *found->second;
      seen_skip_ = true;
      const bool backward = send.action.op == Op::SEND_B;
      body_ +=
          "<line class=\"skip\" x1=\"" + px(x_of(send.start)) + "\" y1=\"" + px(y_of(send.rank)) +
          "\" x2=\"" + px(x_of(recv.end)) + "\" y2=\"" + px(y_of(recv.rank)) + "\" stroke=\"" +
          kSkipColour + "\" stroke-width=\"1.2\" stroke-dasharray=\"" + (backward ? "2,2" : "5,3") +
          "\"><title>" +
          escape(to_string(send.action) + " [" + fmt(send.start) + ", " + fmt(recv.end) + "]") +
          "</title></line>\n";
    }
  }

  // One entry per kind of box drawn; returns the y below the legend.
  double legend(double top) {
    double x = kMarginLeft;
    const double y = top + 4;
    int max_chunks = 1;
    for (const auto& t : timelines_) max_chunks = std::max(max_chunks, chunks_of(t));
    std::vector<Op> ops;
    for (Op op : {Op::F, Op::I, Op::W, Op::B}) {
      if (seen_ops_[static_cast<int>(op)]) ops.push_back(op);
    }
    if (seen_comm_) ops.push_back(Op::SEND_F);
    if (seen_reduce_) ops.push_back(Op::REDUCE_GRAD);
    for (Op op : ops) {
      const std::string name = op_description(op);
      const std::string swatch = is_collective(op) ? kReduceColour
                                 : is_comm(op)     ? "#333333"
                                                   : colour(op, 0);
      rect(x, y, 14, 14, swatch, "legend");
      const bool shaded = max_chunks > 1 && is_compute(op);
      if (shaded) rect(x + 14, y, 14, 14, colour(op, 1), "legend");
      const double box = shaded ? 28 : 14;
      text(x + box + 5, y + 11, name, "11", "start");
      x += box + 5 + name.size() * 6.6 + 18;
    }
    if (seen_skip_) {
      body_ += "<line x1=\"" + px(x) + "\" y1=\"" + px(y + 7) + "\" x2=\"" + px(x + 24) +
               "\" y2=\"" + px(y + 7) + "\" stroke=\"" + kSkipColour +
               "\" stroke-width=\"1.2\" stroke-dasharray=\"5,3\"/>\n";
      const std::string name = "skip connection message";
      text(x + 29, y + 11, name, "11", "start");
      x += 29 + name.size() * 6.6 + 18;
    }
    bool several_stages = false;
    for (const auto& t : timelines_)
      several_stages = several_stages || ranks_hold_several_stages(t);
    if (max_chunks > 1) {
      text(x, y + 11, "(lighter: later model chunk; sN: stage N)", "10", "start",
           "fill=\"#444444\"");
    } else if (several_stages) {
      text(x, y + 11, "(sN: stage N)", "10", "start", "fill=\"#444444\"");
    }
    return top + kLegendHeight;
  }

  const std::vector<Timeline>& timelines_;
  const SvgOptions& options_;
  std::string body_;
  bool seen_ops_[static_cast<int>(Op::OVERLAP_F_B) + 1] = {};  // compute kinds drawn
  bool seen_comm_ = false;
  bool seen_skip_ = false;
  bool seen_reduce_ = false;
};

}  // namespace

std::string render_svg(const Timeline& timeline, const SvgOptions& options) {
  return render_svg(std::vector<Timeline>{timeline}, options);
}

std::string render_svg(const std::vector<Timeline>& timelines, const SvgOptions& options) {
  return SvgWriter(timelines, options).render();
}

namespace detail {

// A coordinate's tenths as a whole number where that is sure to be printf's rounding: for
// |value| < 1e9, value * 10 is within 2^-20 of its exact product, so when it lies less than
// 0.499 from a whole number n, n is the exact product's nearest whole number, the rounding
// printf makes; ties and everything else go to std::to_chars (printf's own digits).
std::string fixed1(double value) {
  const double size = std::fabs(value);
  if (size < 1e9) {
    const double tenths = size * 10;
    const double whole = std::nearbyint(tenths);
    if (std::fabs(tenths - whole) < 0.499) {
      const auto n = static_cast<long long>(whole);
      char buffer[32];
      char* at = buffer;
      if (std::signbit(value)) *at++ = '-';
      at = std::to_chars(at, buffer + sizeof buffer - 2, n / 10).ptr;  // 2 left for ".d"
      *at++ = '.';
      *at++ = static_cast<char>('0' + n % 10);
      return std::string(buffer, at);
    }
  }
  char buffer[320];  // room for any double in fixed notation (1e308 has 309 digits)
  const auto end =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::fixed, 1);
  return std::string(buffer, end.ptr);
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace detail

}  // namespace pptrain
