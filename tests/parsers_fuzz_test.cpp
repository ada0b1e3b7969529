// Fixed-seed random-input tests of every parser of a file a user hands pptrain: the schedule CSV,
// PipeDream's graph.txt, the profile JSON, the partition JSON and the planner's plan.json. Each
// starts from a valid input and feeds thousands of damaged copies (bytes flipped, inserted or
// deleted, lines cut, duplicated or swapped, cells emptied, numbers made huge or negative,
// control and non-ASCII bytes) to the parser. What it checks: a parser either returns or throws
// UserError, whose message is one line of printable ASCII of bounded length (untrusted bytes
// escaped and cut); never another exception, a crash or a hang (CTest's TIMEOUT bounds the run).
// Run under -DPPTRAIN_SANITIZE=address,undefined it also catches out-of-bounds reads.
//
// PPTRAIN_FUZZ_ITERATIONS (default 20000 per parser) sets how many damaged copies each parser
// gets; the seed is fixed, so a failure repeats.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/common/files.h"
#include "pptrain/generators/registry.h"
#include "pptrain/partition/partition.h"
#include "pptrain/partition/profile.h"
#include "pptrain/planner/plan_file.h"
#include "pptrain/schedule/schedule.h"
#include "pptrain/schedule/validate.h"

namespace pptrain {
namespace {

int iterations() {
  const char* text = std::getenv("PPTRAIN_FUZZ_ITERATIONS");
  return text ? std::max(1, std::atoi(text)) : 20000;
}

// One damaged copy of `text`: 1 to 4 random edits.
std::string damage(const std::string& text, std::mt19937& rng) {
  static const std::vector<std::string> tokens = {"",
                                                  ",",
                                                  "\n",
                                                  "\r\n",
                                                  "-1",
                                                  "0",
                                                  "1e309",
                                                  "99999999999999999999",
                                                  "nan",
                                                  "\"",
                                                  "{",
                                                  "}",
                                                  "[",
                                                  "]",
                                                  ":",
                                                  "\xef\xbb\xbf",
                                                  "\x1b[31m",
                                                  std::string(1, '\0'),
                                                  "\xff\xfe",
                                                  "F",
                                                  "B",
                                                  "W",
                                                  "I",
                                                  "SEND_F",
                                                  "RECV_B",
                                                  "2147483648",
                                                  "-2147483649",
                                                  "null",
                                                  "true"};
  std::string out = text;
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = out.empty() ? 0 : rng() % (out.size() + 1);
    switch (rng() % 8) {
      case 0:  // flip a byte
        if (!out.empty()) out[std::min(at, out.size() - 1)] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 1:  // insert a random byte
        out.insert(at, 1, static_cast<char>(rng() % 256));
        break;
      case 2:  // delete a run
        out.erase(at, 1 + rng() % 16);
        break;
      case 3:  // insert a token
        out.insert(at, tokens[rng() % tokens.size()]);
        break;
      case 4:  // cut the text short
        out.resize(at);
        break;
      case 5: {  // duplicate a run
        const size_t length = 1 + rng() % 64;
        out.insert(at, out.substr(at, length));
        break;
      }
      case 6: {  // replace the digits at `at` with a token
        size_t end = at;
        while (end < out.size() && std::isdigit(static_cast<unsigned char>(out[end]))) ++end;
        out.replace(at, end - at, tokens[rng() % tokens.size()]);
        break;
      }
      default: {  // swap two lines
        std::vector<std::string> lines;
        size_t start = 0;
        for (size_t nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) {
          lines.push_back(out.substr(start, nl - start));
        }
        lines.push_back(out.substr(start));
        std::swap(lines[rng() % lines.size()], lines[rng() % lines.size()]);
        out.clear();
        for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + lines[i];
        break;
      }
    }
  }
  return out;
}

// The first line of a message (a schedule error is followed by its grid); it must be printable
// ASCII and bounded.
void expect_clean_message(const std::string& message, const std::string& input) {
  const std::string first = message.substr(0, message.find('\n'));
  EXPECT_FALSE(first.empty());
  EXPECT_LE(first.size(), 1000u) << first.substr(0, 200);
  for (unsigned char c : first) {
    if (c < 0x20 || c > 0x7e) {
      ADD_FAILURE() << "raw byte " << static_cast<int>(c) << " in the message '" << first
                    << "' for input of " << input.size() << " bytes";
      return;
    }
  }
}

// Feeds `parse` the valid `seed` and iterations() damaged copies of it.
void fuzz(const std::string& seed, const std::function<void(const std::string&)>& parse,
          unsigned rng_seed) {
  ASSERT_NO_THROW(parse(seed)) << "the seed input must parse";
  std::mt19937 rng(rng_seed);
  int refused = 0;
  const int n = iterations();
  for (int i = 0; i < n; ++i) {
    const std::string input = damage(seed, rng);
    try {
      parse(input);
    } catch (const UserError& e) {
      ++refused;
      expect_clean_message(e.what(), input);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "iteration " << i << ": not a UserError: " << e.what();
    }
    if (::testing::Test::HasFailure()) return;  // one report, not thousands
  }
  // The damage is real: most copies are refused (a test that could not fail would not be).
  EXPECT_GT(refused, n / 4);
}

TEST(ParsersFuzz, ScheduleCsv) {
  const std::string seed = to_csv(make_schedule({"zb-v", 2, 4}));
  fuzz(
      seed, [](const std::string& text) { validate(parse_csv(text, "fuzz.csv")); }, 1);
}

TEST(ParsersFuzz, PipeDreamGraph) {
  const std::string seed = read_text_file(
      std::string(PPTRAIN_SOURCE_DIR) + "/data/pipedream/alexnet/graph.txt", "graph");
  fuzz(
      seed, [](const std::string& text) { parse_pipedream_graph(text, "graph.txt"); }, 2);
}

TEST(ParsersFuzz, ProfileJson) {
  const std::string seed = R"({"format": "pptrain-profile-1", "model": {"name": "mlp"},
  "settings": {"microbatch_size": 2}, "layers": [
    {"name": "fc1", "forward_ms": 1.5, "backward_input_ms": 2, "backward_weight_ms": 0.5,
     "activation_bytes": 4096, "stash_bytes": 8192, "parameter_bytes": 1000},
    {"name": "fc2", "forward_ms": 0.5, "backward_input_ms": 1, "backward_weight_ms": 0.25,
     "activation_bytes": 64, "stash_bytes": 128, "parameter_bytes": 10}]})";
  fuzz(
      seed, [](const std::string& text) { parse_profile_json(text, "profile.json"); }, 3);
}

TEST(ParsersFuzz, PartitionJson) {
  const std::string seed =
      R"({"method": "pipedream", "stages": [{"first_layer": 0, "last_layer": 1, "replicas": 3},
  {"first_layer": 2, "last_layer": 4, "replicas": 1}]})";
  fuzz(
      seed, [](const std::string& text) { check_partition(parse_partition_json(text), 5); }, 4);
}

TEST(ParsersFuzz, PlanJson) {
  const std::string seed = R"({"format": "pptrain-plan-1", "workers": 2, "batch_size": 8,
  "winner": {"schedule": "zb-v", "chunks": 2, "microbatches": 4, "recompute": true,
             "stage_layers": "0-1,2-3,4-5,6-7"},
  "files": {"partition": "partition.json", "schedule": "schedule.csv", "svg": "timeline.svg"}})";
  fuzz(
      seed, [](const std::string& text) { parse_plan_json(text, "out/plan.json"); }, 5);
}

}  // namespace
}  // namespace pptrain
