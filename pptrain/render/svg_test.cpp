#include "pptrain/render/svg.h"

#include <gtest/gtest.h>

#include <vector>

#include "pptrain/common/check.h"

namespace pptrain {
namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

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

}  // namespace
}  // namespace pptrain
