#include "pptrain/render/svg.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/render/testing.h"
#include "pptrain/schedule/action.h"

namespace pptrain {
namespace {

using testing::count;

// True if every element is closed in order (self-closing or by its closing tag) and no raw '&'
// or '<' stands in text: enough XML to catch a broken writer.
bool tags_balance(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    const size_t end = xml.find('>', at);
    if (end == std::string::npos) return false;
    const std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.empty() || tag.find('<') != std::string::npos) return false;
    if (tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find(' ')));
    }
  }
  for (size_t at = xml.find('&'); at != std::string::npos; at = xml.find('&', at + 1)) {
    if (xml.find(';', at) > at + 6) return false;
  }
  return open.empty();
}

// Interleaved placement on 2 ranks (stage s on rank s % 2), split backward, plus comms.
Timeline interleaved_timeline() {
  Timeline t{"toy & <test>, bubble 10%", 2, {}};
  double clock = 0;
  for (const char* text : {"0F0", "2F0", "2I0", "2W0", "0I0", "0W0"}) {
    t.events.push_back({0, parse_action(text), clock, clock + 1});
    clock += 1;
  }
  clock = 0.5;
  for (const char* text : {"1F0", "3F0", "3I0", "1I0", "3W0", "1W0"}) {
    t.events.push_back({1, parse_action(text), clock, clock + 1});
    clock += 1;
  }
  t.events.push_back({0, parse_action("0SEND_F0"), 1, 1.2});
  return t;
}

TEST(Svg, WellFormedWithOneBoxPerComputeEventAndALegend) {
  const std::string svg = render_svg(interleaved_timeline());
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_NE(svg.find("</svg>\n"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"event\""), 12u);  // the SEND is not drawn by default
  EXPECT_EQ(count(svg, "class=\"comm\""), 0u);
  EXPECT_TRUE(tags_balance(svg));
  // Title escaped, legend for the kinds drawn, stage labels since ranks hold two stages.
  EXPECT_NE(svg.find("toy &amp; &lt;test&gt;, bubble 10%"), std::string::npos);
  EXPECT_NE(svg.find("F forward"), std::string::npos);
  EXPECT_NE(svg.find("I backward (input)"), std::string::npos);
  EXPECT_NE(svg.find("W backward (weights)"), std::string::npos);
  EXPECT_EQ(svg.find("B backward<"), std::string::npos);  // no B event, so no B legend
  EXPECT_NE(svg.find(">s3<"), std::string::npos);
  EXPECT_NE(svg.find(">rank 1<"), std::string::npos);
}

TEST(Svg, StacksTimelinesWithLabelsAndCanDrawComms) {
  SvgOptions options;
  options.labels = {"measured", "predicted"};
  options.show_comms = true;
  options.time_unit = "s";
  const std::string svg = render_svg({interleaved_timeline(), interleaved_timeline()}, options);
  EXPECT_EQ(count(svg, "class=\"event\""), 24u);
  EXPECT_EQ(count(svg, "class=\"comm\""), 2u);
  EXPECT_NE(svg.find(">measured<"), std::string::npos);
  EXPECT_NE(svg.find(">predicted<"), std::string::npos);
  EXPECT_EQ(count(svg, ">rank 0<"), 2u);
  EXPECT_TRUE(tags_balance(svg));
  EXPECT_NE(svg.find("time (s)"), std::string::npos);
  options.labels = {"only one"};
  EXPECT_THROW(render_svg({interleaved_timeline(), interleaved_timeline()}, options), UserError);
}

// The value of attribute `name` in each element whose text starts with `element` (e.g.
// "<rect class=\"event\""), in order.
std::vector<double> attributes(const std::string& svg, const std::string& element,
                               const std::string& name) {
  std::vector<double> out;
  for (size_t at = svg.find(element); at != std::string::npos; at = svg.find(element, at + 1)) {
    const size_t value = svg.find(" " + name + "=\"", at) + name.size() + 3;
    out.push_back(std::stod(svg.substr(value)));
  }
  return out;
}

TEST(Svg, ReductionsGoInALaneUnderTheirRankWithALegendEntry) {
  Timeline t = interleaved_timeline();
  const std::string plain = render_svg(t);
  EXPECT_EQ(count(plain, "class=\"reduce\""), 0u);
  EXPECT_EQ(plain.find("all-reduce"), std::string::npos);
  t.events.push_back({1, parse_action("3REDUCE_GRAD"), 4.5, 7});
  const std::string svg = render_svg(t);
  EXPECT_TRUE(tags_balance(svg));
  EXPECT_EQ(count(svg, "class=\"reduce\""), 1u);
  EXPECT_EQ(count(svg, "class=\"event\""), 12u);  // not drawn as a compute box
  EXPECT_NE(svg.find(">all-reduce of gradients (--dp)<"), std::string::npos);
  EXPECT_NE(svg.find("<title>3REDUCE_GRAD [4.5, 7]</title>"), std::string::npos);
  // The bar lies under rank 1's boxes (the lowest ones), so it covers none of them, and is as
  // long as the all-reduce: 2.5 of the 7 time units over 1000 px.
  const std::vector<double> boxes = attributes(svg, "<rect class=\"event\"", "y");
  const double bar = attributes(svg, "<rect class=\"reduce\"", "y").at(0);
  EXPECT_GE(bar, *std::max_element(boxes.begin(), boxes.end()) + SvgOptions{}.row_height_px);
  EXPECT_NEAR(attributes(svg, "<rect class=\"reduce\"", "width").at(0), 1000 * 2.5 / 7, 0.1);
  // Each rank's row gained a lane.
  EXPECT_GT(attributes(svg, "<svg ", "height").at(0), attributes(plain, "<svg ", "height").at(0));
}

// Replicated stages (Chimera: rank 0 holds stages 0 and 1 of two) keep V = 1 colours but label
// each box with its stage, which tells the two directions apart; one stage per rank does not.
// A skip connection's messages are drawn from send to receive, with a legend entry, even when the
// other transfers are not.
TEST(Svg, SkipMessagesAreLinesFromSendToReceive) {
  Timeline t;
  t.num_ranks = 3;
  const auto event = [&t](int rank, const char* action, double start, double end) {
    t.events.push_back({rank, parse_action(action), start, end});
  };
  event(0, "0F0", 0, 1);
  event(0, "0SEND_F0>2", 1, 1);
  event(1, "1F0", 1, 2);
  event(2, "2RECV_F0<0", 2, 2);
  event(2, "2F0", 2, 3);
  event(2, "2B0", 3, 5);
  event(2, "2SEND_B0>0", 5, 5);
  event(1, "1B0", 5, 7);
  event(0, "0RECV_B0<2", 7, 7);
  event(0, "0B0", 7, 9);
  const std::string svg = render_svg(t);
  EXPECT_TRUE(tags_balance(svg)) << svg;
  EXPECT_EQ(count(svg, "<line class=\"skip\""), 2u) << svg;
  EXPECT_EQ(count(svg, "2SEND_B0&gt;0 [5, 7]"), 1u) << svg;
  EXPECT_EQ(count(svg, "skip connection message"), 1u);
  EXPECT_EQ(count(svg, "class=\"comm\""), 0u);  // the other transfers: only with show_comms
  // Without its receive, a send draws nothing.
  t.events.erase(t.events.begin() + 3);
  EXPECT_EQ(count(render_svg(t), "<line class=\"skip\""), 1u);
}

TEST(Svg, RanksWithTwoStagesLabelTheStage) {
  Timeline t;
  t.num_ranks = 2;
  t.events = {{0, Action::make(Op::F, 0, 0), 0, 1},
              {0, Action::make(Op::F, 1, 1), 1, 2},
              {1, Action::make(Op::F, 1, 0), 1, 2},
              {1, Action::make(Op::F, 0, 1), 2, 3}};
  const std::string svg = render_svg(t);
  EXPECT_TRUE(tags_balance(svg));
  EXPECT_EQ(count(svg, ">s1<"), 2u);
  EXPECT_NE(svg.find("(sN: stage N)"), std::string::npos);
  t.events = {{0, Action::make(Op::F, 0, 0), 0, 1}, {1, Action::make(Op::F, 1, 0), 1, 2}};
  EXPECT_EQ(render_svg(t).find(">s1<"), std::string::npos);
}

// Coordinates are printf's "%.1f", digit for digit: values of every size, both signs, and those
// right at and beside a tie (x.x5), where a rounding of the product by 10 could go either way.
TEST(Svg, CoordinatesArePrintfsTenths) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> values = {0.0,  -0.0,         0.05, 0.15, 0.25, 0.35,  -0.05,  -0.04, 0.95,
                                9.95, 999999999.95, 1e9,  -1e9, 1e15, 1e300, 123.45, 2.675, 1.005};
  for (int i = 0; i < 200000; ++i) {
    const double scale = std::pow(10.0, std::uniform_int_distribution<int>(-3, 12)(rng));
    double v = unit(rng) * scale;
    if (i % 3 == 0) v = std::round(v * 10) / 10 + 0.05;                  // at a tie
    if (i % 3 == 1) v = std::nextafter(std::round(v * 20) / 20, 1e300);  // beside one
    values.push_back(i % 2 ? -v : v);
  }
  for (double v : values) {
    char expected[400];
    std::snprintf(expected, sizeof expected, "%.1f", v);
    ASSERT_EQ(detail::fixed1(v), expected) << std::hexfloat << v;
  }
}

}  // namespace
}  // namespace pptrain
