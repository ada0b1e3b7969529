#include "pptrain/partition/profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "pptrain/common/check.h"
#include "pptrain/partition/testing.h"

namespace pptrain {
namespace {

// Expects a UserError of one line whose message contains every one of `parts`.
template <typename F>
void expect_user_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    for (const char* part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
  }
}

const char* kTwoLayers = R"({"format": "pptrain-profile-1", "model": {"name": "mlp"},
  "layers": [
    {"name": "fc1", "forward_ms": 1.5, "backward_input_ms": 2, "backward_weight_ms": 0.5,
     "activation_bytes": 4096, "stash_bytes": 8192, "parameter_bytes": 1000},
    {"name": "fc2", "forward_ms": 0.5, "backward_input_ms": 1, "backward_weight_ms": 0.25,
     "activation_bytes": 64, "stash_bytes": 128, "parameter_bytes": 10,
     "weight_stash_bytes": 96, "forward_transient_bytes": 32, "backward_transient_bytes": 48,
     "stash_fixed_bytes": 16, "forward_transient_fixed_bytes": 32,
     "backward_transient_fixed_bytes": 8}],
  "batch": {"input_bytes": 256, "target_bytes": 128}})";

TEST(ProfileJson, ReadsEveryField) {
  Profile p = parse_profile_json(kTwoLayers, "mlp.json");
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.source, "mlp.json");
  EXPECT_EQ(p.layers[0].name, "fc1");
  EXPECT_DOUBLE_EQ(p.layers[0].forward_ms, 1.5);
  EXPECT_DOUBLE_EQ(p.layers[0].backward_input_ms, 2);
  EXPECT_DOUBLE_EQ(p.layers[0].backward_weight_ms, 0.5);
  EXPECT_DOUBLE_EQ(p.layers[0].compute_ms(), 4);
  EXPECT_DOUBLE_EQ(p.layers[0].activation_bytes, 4096);
  EXPECT_DOUBLE_EQ(p.layers[0].stash_bytes, 8192);
  EXPECT_DOUBLE_EQ(p.layers[1].parameter_bytes, 10);
  EXPECT_DOUBLE_EQ(p.layers[0].weight_stash_bytes, -1);  // optional: not measured
  EXPECT_DOUBLE_EQ(p.layers[1].weight_stash_bytes, 96);
  EXPECT_DOUBLE_EQ(p.layers[0].forward_transient_bytes, -1);
  EXPECT_DOUBLE_EQ(p.layers[1].forward_transient_bytes, 32);
  EXPECT_DOUBLE_EQ(p.layers[1].backward_transient_bytes, 48);
  EXPECT_DOUBLE_EQ(p.layers[0].stash_fixed_bytes, 0);  // optional: all of it grows
  EXPECT_DOUBLE_EQ(p.layers[1].stash_fixed_bytes, 16);
  EXPECT_DOUBLE_EQ(p.layers[1].forward_transient_fixed_bytes, 32);
  EXPECT_DOUBLE_EQ(p.layers[1].backward_transient_fixed_bytes, 8);
  EXPECT_DOUBLE_EQ(p.input_bytes, 256);
  EXPECT_DOUBLE_EQ(p.target_bytes, 128);
}

// A profile says what its layers computed in; taken at another precision its bytes scale by the
// elements' sizes, its parameters, batch and times stay as measured.
TEST(ProfileJson, ItsPrecisionIsReadAndItsBytesTakenAtAnother) {
  Profile fp32 = parse_profile_json(kTwoLayers, "mlp.json");
  EXPECT_EQ(fp32.precision, Precision::kFp32);  // says none
  const Profile bf16 = at_precision(fp32, Precision::kBf16);
  EXPECT_EQ(bf16.precision, Precision::kBf16);
  EXPECT_DOUBLE_EQ(bf16.layers[0].activation_bytes, 2048);
  EXPECT_DOUBLE_EQ(bf16.layers[0].stash_bytes, 4096);
  EXPECT_DOUBLE_EQ(bf16.layers[0].weight_stash_bytes, -1);  // not measured: left so
  EXPECT_DOUBLE_EQ(bf16.layers[1].weight_stash_bytes, 48);
  EXPECT_DOUBLE_EQ(bf16.layers[1].backward_transient_bytes, 24);
  EXPECT_DOUBLE_EQ(bf16.layers[1].stash_fixed_bytes, 8);
  EXPECT_DOUBLE_EQ(bf16.layers[1].backward_transient_fixed_bytes, 4);
  EXPECT_DOUBLE_EQ(bf16.layers[0].parameter_bytes, 1000);
  EXPECT_DOUBLE_EQ(bf16.layers[0].forward_ms, 1.5);
  EXPECT_DOUBLE_EQ(bf16.input_bytes, 256);
  EXPECT_DOUBLE_EQ(at_precision(bf16, Precision::kFp32).layers[0].stash_bytes, 8192);

  std::string text = kTwoLayers;
  text.insert(text.find("\"layers\""), R"("settings": {"precision": "fp16"}, )");
  EXPECT_EQ(parse_profile_json(text, "mlp.json").precision, Precision::kFp16);
  std::string bad = kTwoLayers;
  bad.insert(bad.find("\"layers\""), R"("settings": {"precision": "fp8"}, )");
  expect_user_error([&] { parse_profile_json(bad, "mlp.json"); },
                    {"mlp.json: settings: precision fp8: expected fp32, bf16 or fp16"});
}

TEST(ProfileJson, RejectsBadProfilesNamingTheProblem) {
  auto without = [](const std::string& field) {
    std::string text = kTwoLayers;
    size_t at = text.rfind("\"" + field + "\"");  // in the second layer
    size_t end = text.find_first_of(",}", at);
    return text.erase(at, end - at + (text[end] == ',' ? 1 : 0));
  };
  expect_user_error([&] { parse_profile_json(without("stash_bytes"), "m.json"); },
                    {"m.json", "layer 1", "fc2", "stash_bytes"});
  expect_user_error([&] { parse_profile_json(without("forward_ms"), "m.json"); },
                    {"layer 1", "forward_ms"});
  std::string negative = kTwoLayers;
  negative.replace(negative.find("\"forward_ms\": 1.5"), 17, "\"forward_ms\": -1.5");
  expect_user_error([&] { parse_profile_json(negative, "m.json"); },
                    {"layer 0", "fc1", "forward_ms", ">= 0", "-1.5"});
  expect_user_error([&] { parse_profile_json(R"({"layers": []})", "e.json"); },
                    {"e.json", "empty"});
  expect_user_error([&] { parse_profile_json(R"({"format": "other", "layers": []})"); },
                    {"format", "other"});
  expect_user_error([&] { parse_profile_json("{\"layers\": [", "t.json"); }, {"t.json", "JSON"});
  std::string bad_batch = kTwoLayers;
  bad_batch.replace(bad_batch.find("\"target_bytes\": 128"), 19, "\"target_bytes\": -8");
  expect_user_error([&] { parse_profile_json(bad_batch, "b.json"); },
                    {"b.json", "batch", "target_bytes", ">= 0"});
  std::string bad_transient = kTwoLayers;
  bad_transient.replace(bad_transient.find("\"forward_transient_bytes\": 32"), 29,
                        "\"forward_transient_bytes\": \"x\"");
  expect_user_error([&] { parse_profile_json(bad_transient, "t.json"); },
                    {"layer 1", "forward_transient_bytes", "number"});
  std::string bad_fixed = kTwoLayers;  // a part larger than its whole
  bad_fixed.replace(bad_fixed.find("\"stash_fixed_bytes\": 16"), 23, "\"stash_fixed_bytes\": 200");
  expect_user_error(
      [&] { parse_profile_json(bad_fixed, "f.json"); },
      {"f.json", "layer 1", "stash_fixed_bytes (200)", "exceeds", "stash_bytes (128)"});
  expect_user_error(
      [&] { parse_profile_json(R"({"layers": [{"name": "x", "forward_ms": "1"}]})"); },
      {"forward_ms", "number"});
}

// The optional "network" object: the all-reduce measurement, checked like the layers.
TEST(ProfileJson, ReadsTheAllreduceMeasurement) {
  const auto with_network = [](const std::string& network) {
    std::string text = kTwoLayers;
    return text.insert(text.rfind('}'), ", \"network\": " + network);
  };
  EXPECT_FALSE(parse_profile_json(kTwoLayers).network.measured());
  const Profile p = parse_profile_json(with_network(R"({"allreduce_ranks": 2,
      "allreduce_bandwidth_bytes_per_s": 1e9, "allreduce_latency_ms": 0.5})"));
  EXPECT_TRUE(p.network.measured());
  EXPECT_EQ(p.network.ranks, 2);
  EXPECT_DOUBLE_EQ(p.network.bandwidth_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(p.network.latency_ms, 0.5);
  expect_user_error(
      [&] {
        parse_profile_json(with_network(R"({"allreduce_ranks": 1,
            "allreduce_bandwidth_bytes_per_s": 1e9, "allreduce_latency_ms": 0.5})"),
                           "n.json");
      },
      {"n.json: network", "allreduce_ranks", ">= 2"});
  expect_user_error(
      [&] {
        parse_profile_json(with_network(R"({"allreduce_ranks": 2, "allreduce_latency_ms": 0})"));
      },
      {"network", "allreduce_bandwidth_bytes_per_s"});
  expect_user_error([&] { parse_profile_json(with_network("[]")); }, {"network", "object"});
}

// The optional "overheads" object (runtime/overhead_probe.h): absent, it is zero; a bad value
// is one line naming the field. NaN cannot be written in JSON: nlohmann writes it as null.
TEST(ProfileJson, ReadsTheOverheads) {
  const auto with_overheads = [](const std::string& overheads) {
    std::string text = kTwoLayers;
    return text.insert(text.rfind('}'), ", \"overheads\": " + overheads);
  };
  const Profile old = parse_profile_json(kTwoLayers);
  EXPECT_FALSE(old.overheads.measured());
  EXPECT_EQ(old.overheads.action_ms, 0);
  EXPECT_EQ(old.overheads.send_ms, 0);
  EXPECT_EQ(old.overheads.recv_ms, 0);
  const Profile p = parse_profile_json(
      with_overheads(R"({"action_ms": 0.02, "send_ms": 0.05, "recv_ms": 0.03})"));
  EXPECT_TRUE(p.overheads.measured());
  EXPECT_DOUBLE_EQ(p.overheads.action_ms, 0.02);
  EXPECT_DOUBLE_EQ(p.overheads.send_ms, 0.05);
  EXPECT_DOUBLE_EQ(p.overheads.recv_ms, 0.03);
  for (const char* bad : {R"({"action_ms": -0.02, "send_ms": 0.05, "recv_ms": 0.03})",
                          R"({"action_ms": null, "send_ms": 0.05, "recv_ms": 0.03})",
                          R"({"action_ms": "NaN", "send_ms": 0.05, "recv_ms": 0.03})"}) {
    SCOPED_TRACE(bad);
    expect_user_error([&] { parse_profile_json(with_overheads(bad), "o.json"); },
                      {"o.json: overheads", "action_ms"});
  }
  expect_user_error([&] { parse_profile_json(with_overheads(R"({"action_ms": 0.02})")); },
                    {"overheads", "send_ms"});
  expect_user_error([&] { parse_profile_json(with_overheads("[]")); }, {"overheads", "object"});
}

std::string node(const std::string& id, const std::string& desc, double f, double b, double act,
                 double params) {
  char fields[256];
  std::snprintf(fields, sizeof fields,
                " -- forward_compute_time=%.3f, backward_compute_time=%.3f, "
                "activation_size=%.1f, parameter_size=%.1f\n",
                f, b, act, params);
  return id + " -- " + desc + fields;
}

TEST(PipeDreamGraph, ChainKeepsCostsAndDropsInputs) {
  std::string text = node("node2", "Conv2d(3, 8, kernel_size=(3, 3))", 2, 3, 100, 50) +
                     node("node1", "Input", 7, 0, 999, 0) +
                     node("node3", "Linear(in_features=8, out_features=2)", 1, 1, 10, 20) +
                     "\tnode1 -- node2\n\tnode2 -- node3";  // no final newline, like the files
  Profile p = parse_pipedream_graph(text, "g.txt");
  ASSERT_EQ(p.layers.size(), 2u);
  EXPECT_EQ(p.layers[0].name, "node2 Conv2d(3, 8, kernel_size=(3, 3))");
  EXPECT_DOUBLE_EQ(p.layers[0].forward_ms, 2);
  EXPECT_DOUBLE_EQ(p.layers[0].backward_input_ms, 3);
  EXPECT_DOUBLE_EQ(p.layers[0].backward_weight_ms, 0);
  EXPECT_DOUBLE_EQ(p.layers[0].activation_bytes, 100);  // node2's output crosses the cut
  EXPECT_DOUBLE_EQ(p.layers[0].stash_bytes, 100);
  EXPECT_DOUBLE_EQ(p.layers[1].parameter_bytes, 20);
  EXPECT_DOUBLE_EQ(p.layers[1].activation_bytes, 0);  // nothing after the last layer
}

TEST(PipeDreamGraph, BranchesBecomeAChainWithCrossingBytes) {
  // a -> b -> d, a -> c -> d (a residual block), plus an unused __getitem__ sink after b and an
  // activation list on c.
  std::string text = node("node1", "Conv", 1, 1, 100, 0) + node("node2", "Conv", 1, 1, 20, 0) +
                     "node3 -- Split -- forward_compute_time=1, backward_compute_time=1, "
                     "activation_size=[3.0; 4.0], parameter_size=0\n" +
                     node("node4", "Add", 1, 1, 1000, 0) +
                     node("node5", "__getitem__(1)", 0, 0, 5, 0) +
                     "\tnode1 -- node2\n\tnode1 -- node3\n\tnode2 -- node4\n\tnode3 -- node4\n"
                     "\tnode2 -- node5\n";
  Profile p = parse_pipedream_graph(text);
  ASSERT_EQ(p.layers.size(), 4u);
  EXPECT_EQ(p.layers[2].name, "node3 Split");
  EXPECT_DOUBLE_EQ(p.layers[2].stash_bytes, 7);         // the list is summed
  EXPECT_DOUBLE_EQ(p.layers[0].activation_bytes, 100);  // a, once though two nodes read it
  EXPECT_DOUBLE_EQ(p.layers[1].activation_bytes, 120);  // a (still needed by c) and b
  EXPECT_DOUBLE_EQ(p.layers[2].activation_bytes, 27);   // b and c
}

TEST(PipeDreamGraph, RejectsBadGraphsNamingTheProblem) {
  std::string a = node("node1", "Conv", 1, 1, 1, 1), b = node("node2", "ReLU", 1, 1, 1, 0);
  expect_user_error(
      [&] { parse_pipedream_graph(a + b + "\tnode1 -- node2\n\tnode2 -- node1\n", "c.txt"); },
      {"c.txt", "cycle", "node"});
  expect_user_error([&] { parse_pipedream_graph(a + "\tnode1 -- node9\n", "u.txt"); },
                    {"u.txt:2", "unknown node 'node9'"});
  expect_user_error([&] { parse_pipedream_graph(a + node("node2", "ReLU", -1, 1, 1, 0), "n.txt"); },
                    {"n.txt:2", "node2", "forward_compute_time", ">= 0"});
  expect_user_error(
      [&] {
        parse_pipedream_graph(
            "node1 -- Conv -- forward_compute_time=1, activation_size=1, parameter_size=1\n",
            "m.txt");
      },
      {"m.txt:1", "node1", "backward_compute_time"});
  expect_user_error([&] { parse_pipedream_graph("\n\n", "e.txt"); }, {"e.txt", "empty"});
  expect_user_error([&] { parse_pipedream_graph(a + a, "d.txt"); }, {"d.txt:2", "twice"});
  expect_user_error([&] { parse_pipedream_graph("hello world\n", "h.txt"); },
                    {"h.txt:1", "expected"});
}

TEST(PipeDreamGraph, CycleMessageNamesANodeOnTheCycle) {
  // node1 -> node2 <-> node3: node1 is not on the cycle.
  std::string text = node("node1", "Conv", 1, 1, 1, 1) + node("node2", "A", 1, 1, 1, 0) +
                     node("node3", "B", 1, 1, 1, 0) +
                     "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node2\n";
  try {
    parse_pipedream_graph(text, "c.txt");
    FAIL() << "expected a cycle error";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_TRUE(msg.find("'node2'") != std::string::npos ||
                msg.find("'node3'") != std::string::npos)
        << msg;
  }
}

TEST(ShippedProfiles, AllFourParseWithPositiveCosts) {
  ASSERT_EQ(testing::repo_root().front(), '/') << "PPTRAIN_SOURCE_DIR is not absolute";
  // Node counts of the files, less their Input nodes and unused __getitem__ sinks.
  const std::pair<const char*, size_t> expected[] = {
      {"alexnet", 22}, {"vgg16", 40}, {"resnet50", 176}, {"gnmt", 48 - 3 - 8}};
  for (auto [model, layers] : expected) {
    SCOPED_TRACE(model);
    Profile p = read_profile(testing::shipped_graph(model));
    EXPECT_EQ(p.layers.size(), layers);
    double total_ms = 0, params = 0;
    for (size_t i = 0; i < p.layers.size(); ++i) {
      total_ms += p.layers[i].compute_ms();
      params += p.layers[i].parameter_bytes;
    }
    EXPECT_GT(total_ms, 10);
    EXPECT_GT(params, 1e6);
    EXPECT_DOUBLE_EQ(p.layers.back().activation_bytes, 0);
  }
}

TEST(ShippedProfiles, Vgg16MatchesTheFile) {
  Profile p = read_profile(testing::shipped_graph("vgg16"));
  // The input (17.972 ms of data loading) is dropped; node2 is the first conv.
  EXPECT_EQ(p.layers.front().name.rfind("node2 Conv2d(3, 64", 0), 0u);
  EXPECT_DOUBLE_EQ(p.layers.front().forward_ms, 22.307);
  EXPECT_EQ(p.layers.back().name.rfind("node41 Linear", 0), 0u);
  double params = 0;
  for (const LayerProfile& l : p.layers) params += l.parameter_bytes;
  EXPECT_NEAR(params, 553430176, 1);  // VGG16's 138.4M float parameters
  // A chain except for the flatten (MaxPool -> Size -> View, MaxPool -> View): every cut carries
  // exactly its layer's output, but the cut after Size also carries the MaxPool output.
  for (size_t i = 0; i + 1 < p.layers.size(); ++i) {
    SCOPED_TRACE(p.layers[i].name);
    double expected = p.layers[i].stash_bytes;
    if (p.layers[i].name.rfind("node33 Size", 0) == 0) expected += p.layers[i - 1].stash_bytes;
    EXPECT_DOUBLE_EQ(p.layers[i].activation_bytes, expected);
  }
}

TEST(ReadProfile, ChoosesTheFormatByContent) {
  std::string json_path =
      ::testing::TempDir() + "/pptrain_read_profile_" + std::to_string(::getpid()) + ".json";
  std::string graph_path =
      ::testing::TempDir() + "/pptrain_read_profile_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(json_path) << "\n  " << kTwoLayers;
  std::ofstream(graph_path) << node("node1", "Conv", 1, 2, 3, 4);
  EXPECT_EQ(read_profile(json_path).layers.size(), 2u);
  EXPECT_EQ(read_profile(json_path).source, json_path);
  EXPECT_EQ(read_profile(graph_path).layers.at(0).name, "node1 Conv");
  expect_user_error([] { read_profile("/nonexistent/profile.json"); },
                    {"cannot read profile", "/nonexistent/profile.json"});
  std::remove(json_path.c_str());
  std::remove(graph_path.c_str());
}

}  // namespace
}  // namespace pptrain
