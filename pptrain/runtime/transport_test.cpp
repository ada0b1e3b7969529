#include "pptrain/runtime/transport.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pptrain/common/check.h"
#include "pptrain/device/memory.h"
#include "pptrain/runtime/group.h"
#include "pptrain/runtime/launcher.h"
#include "pptrain/runtime/loopback_transport.h"
#include "pptrain/runtime/testing.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

// A send and the receive at its other end carry the same tag; no two messages of a step share
// one, and all stay below the control tags.
// Skip messages included.
TEST(MessageTag, BothEndsAgreeAndMessagesNeverShare) {
  Schedule schedule;
  schedule.num_stages = 6;
  schedule.num_microbatches = 5;
  schedule.skips = {{0, 5}, {1, 4}, {1, 5}};
  std::vector<Action> sends;
  for (int s = 0; s < schedule.num_stages; ++s) {
    for (int m = 0; m < schedule.num_microbatches; ++m) {
      if (s + 1 < schedule.num_stages) sends.push_back(Action::make(Op::SEND_F, s, m));
      if (s > 0) sends.push_back(Action::make(Op::SEND_B, s, m));
    }
  }
  for (const SkipLink& skip : schedule.skips) {
    for (int m = 0; m < schedule.num_microbatches; ++m) {
      sends.push_back(Action::skip(Op::SEND_F, skip.from, m, skip.to));
      sends.push_back(Action::skip(Op::SEND_B, skip.to, m, skip.from));
    }
  }
  std::set<int> tags;
  for (const Action& send : sends) {
    const int tag = message_tag(send, schedule);
    EXPECT_EQ(tag, message_tag(comm_peer(send), schedule)) << to_string(send);
    EXPECT_TRUE(tags.insert(tag).second) << to_string(send);
    EXPECT_GE(tag, 0);
    EXPECT_LT(tag, kControlTagBase);
  }
  EXPECT_EQ(tags.size(), message_count(schedule));
}

TEST(MessageTag, TooManyMessagesForTheTagsIsAUserError) {
  try {
    Schedule huge;
    huge.num_stages = 1 << 16;
    huge.num_microbatches = 1 << 14;
    message_tag(Action::make(Op::SEND_F, 0, 0), huge);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("65536 stages and 16384 microbatches"), std::string::npos)
        << e.what();
  }
}

// Two ranks (threads of this process) over Gloo: a receive posted before the send, an
// all-reduce and a barrier.
TEST(Transport, GlooSendRecvAllreduceBetweenTwoRanks) {
  const int port = find_free_port();
  std::vector<torch::Tensor> received(2), reduced(2);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    TransportOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.master_port = port;
    options.timeout = std::chrono::seconds(30);
    auto transport = connect_transport(options);
    auto buffer = torch::zeros({3});
    auto posted = transport->recv(buffer, 1 - rank, 7);
    auto sent = transport->send(torch::full({3}, 10.0f + rank), 1 - rank, 7);
    posted.wait();
    sent.wait();
    received[rank] = buffer;
    auto value = torch::full({2}, static_cast<double>(rank + 1), torch::kFloat64);
    transport->allreduce_sum(value);
    reduced[rank] = value;
    transport->barrier();
  });
  ASSERT_EQ(errors, "");
  EXPECT_TRUE(torch::equal(received[0], torch::full({3}, 11.0f)));
  EXPECT_TRUE(torch::equal(received[1], torch::full({3}, 10.0f)));
  for (const auto& r : reduced)
    EXPECT_TRUE(torch::equal(r, torch::full({2}, 3.0, torch::kFloat64)));
}

// Four ranks in two groups, {0, 2} and {1, 3}, as the replicas of two pipeline ranks: each
// group's all-reduce sums its own members only, even started before a send and waited after,
// messages use the group's ranks, and make_group covers one member and the whole world.
// `world_of(rank)`, called on rank's thread, gives its world transport.
void check_groups(const std::function<Transport&(int rank)>& world_of) {
  constexpr int kRanks = 4;
  std::vector<torch::Tensor> reduced(kRanks), received(kRanks);
  std::vector<int> group_ranks(kRanks), world_views(kRanks);
  const std::string errors = testing::run_rank_threads(kRanks, [&](int rank) {
    Transport* world = &world_of(rank);
    const Group pair = make_group(*world, {rank % 2, rank % 2 + 2});
    const Group self = make_group(*world, {rank});
    const Group all = make_group(*world, {0, 1, 2, 3});
    group_ranks[rank] = pair->rank() * 10 + self->world_size();
    world_views[rank] = all.view == world ? 1 : 0;
    auto value = torch::full({3}, static_cast<float>(rank + 1));
    auto started = pair->allreduce_sum_async(value);
    auto buffer = torch::zeros({1});
    auto posted = pair->recv(buffer, 1 - pair->rank(), 5);
    pair->send(torch::full({1}, static_cast<float>(rank)), 1 - pair->rank(), 5).wait();
    posted.wait();
    started.wait();
    reduced[rank] = value;
    received[rank] = buffer;
    world->barrier();
  });
  ASSERT_EQ(errors, "");
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    // {0, 2}: 1 + 3; {1, 3}: 2 + 4.
    EXPECT_TRUE(torch::equal(reduced[rank], torch::full({3}, rank % 2 == 0 ? 4.0f : 6.0f)));
    EXPECT_EQ(received[rank].item<float>(), static_cast<float>((rank + 2) % kRanks));
    EXPECT_EQ(group_ranks[rank], (rank / 2) * 10 + 1);
    EXPECT_EQ(world_views[rank], 1);
  }
}

// The `world_of(rank)` of a check over Gloo: rank's world transport among `worlds.size()`
// ranks on a free port, connected on the rank's own thread.
std::function<Transport&(int rank)> gloo_worlds(std::vector<std::unique_ptr<Transport>>& worlds) {
  const int port = find_free_port();
  return [&worlds, port](int rank) -> Transport& {
    TransportOptions options;
    options.rank = rank;
    options.world_size = static_cast<int>(worlds.size());
    options.master_port = port;
    options.timeout = std::chrono::seconds(30);
    worlds[rank] = connect_transport(options);
    return *worlds[rank];
  };
}

TEST(Transport, GlooGroupsOfReplicas) {
  std::vector<std::unique_ptr<Transport>> worlds(4);
  check_groups(gloo_worlds(worlds));
}

TEST(Transport, LoopbackGroupsOfReplicas) {
  auto transports = make_loopback_transports(4, std::chrono::seconds(30));
  check_groups([&](int rank) -> Transport& { return *transports[rank]; });
}

// An independent transport's collectives never pair with the world's: rank 0 sums on the world
// first, rank 1 on the independent transport first (from a thread of its own), and each sum
// still adds its own values.
void check_independent(const std::function<Transport&(int rank)>& world_of) {
  std::vector<double> world_sums(2), own_sums(2);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    Transport& world = world_of(rank);
    std::unique_ptr<Transport> own = world.independent("checkpoint");
    EXPECT_EQ(own->rank(), rank);
    auto on_world = torch::full({4}, rank + 1.0, torch::kFloat64);
    auto on_own = torch::full({4}, 10.0 * (rank + 1), torch::kFloat64);
    std::thread background([&] {
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      own->allreduce_sum(on_own);
    });
    world.allreduce_sum(on_world);
    background.join();
    world_sums[rank] = on_world[0].item<double>();
    own_sums[rank] = on_own[0].item<double>();
    world.barrier();
  });
  ASSERT_EQ(errors, "");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(world_sums[rank], 3.0);
    EXPECT_EQ(own_sums[rank], 30.0);
  }
}

TEST(Transport, GlooIndependentTransport) {
  std::vector<std::unique_ptr<Transport>> worlds(2);
  check_independent(gloo_worlds(worlds));
}

TEST(Transport, LoopbackIndependentTransport) {
  auto transports = make_loopback_transports(2, std::chrono::seconds(30));
  check_independent([&](int rank) -> Transport& { return *transports[rank]; });
}

// Rank `rank` of two on `port`, without a heartbeat.
TransportOptions pair_options(int rank, int port, std::chrono::milliseconds timeout,
                              bool shared_memory) {
  TransportOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.master_port = port;
  options.timeout = timeout;
  options.heartbeat = false;
  options.shared_memory = shared_memory;
  return options;
}

// Two ranks of this process on shared memory and on Gloo alone (TransportOptions::
// shared_memory): the same bytes arrive for every pattern the executor makes. Receives posted
// before and after their message, two messages of one tag in order, receives waited on in
// another order than sent, a message above the shared-memory limit (4 MiB: Gloo), an empty
// one, and more in flight than a ring holds (8 MiB), sent before the receiver posts anything.
// `only_rank_0`: rank 1 turns shared memory off, so both fall back to Gloo. Each rank's
// transport must say which link it used (link_to).
void check_messages(bool shared_memory, bool only_rank_0 = false) {
  SCOPED_TRACE(shared_memory ? (only_rank_0 ? "shared memory on rank 0 only" : "shared memory")
                             : "gloo");
  const LinkKind expected = shared_memory && !only_rank_0 ? LinkKind::kShm : LinkKind::kGloo;
  const int port = find_free_port();
  const auto message = [](int index, int64_t floats) {
    return torch::arange(floats, torch::kFloat32) + static_cast<float>(1000 * index);
  };
  const std::vector<int64_t> sizes = {3, 0, 1 << 18, 5 << 18, 7, 7};  // floats; 5 MiB
  const std::vector<int> tags = {1, 2, 3, 4, 5, 5};
  constexpr int kMany = 12;  // of 1 MiB each
  std::vector<torch::Tensor> got(sizes.size() + kMany);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    auto transport = connect_transport(pair_options(rank, port, std::chrono::seconds(30),
                                                    shared_memory && (rank == 0 || !only_rank_0)));
    PPTRAIN_CHECK(transport->link_to(1 - rank) == expected, "rank ", rank, " used ",
                  link_name(transport->link_to(1 - rank)), ", not ", link_name(expected));
    PPTRAIN_CHECK(transport->link_to(rank) == LinkKind::kLocal, "rank ", rank, " to itself");
    if (rank == 0) {
      std::vector<PendingComm> sent;
      for (size_t i = 0; i < sizes.size(); ++i) {
        sent.push_back(transport->send(message(static_cast<int>(i), sizes[i]), 1, tags[i]));
      }
      for (int i = 0; i < kMany; ++i) {
        sent.push_back(transport->send(message(100 + i, 1 << 18), 1, 100 + i));
      }
      for (auto& s : sent) s.wait();
    } else {
      std::vector<PendingComm> posted;
      // Posted before anything is sent: the first three; the rest after their messages came.
      for (size_t i = 0; i < 3; ++i) {
        got[i] = torch::full({sizes[i]}, -1.0f);
        posted.push_back(transport->recv(got[i], 0, tags[i]));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      posted[0].wait();  // takes in what came meanwhile, before its receives are posted
      for (size_t i = 3; i < sizes.size(); ++i) {
        got[i] = torch::full({sizes[i]}, -1.0f);
        posted.push_back(transport->recv(got[i], 0, tags[i]));
      }
      for (int i = 0; i < kMany; ++i) {
        got[sizes.size() + i] = torch::full({1 << 18}, -1.0f);
        posted.push_back(transport->recv(got[sizes.size() + i], 0, 100 + i));
      }
      for (size_t i = posted.size(); i-- > 0;) posted[i].wait();  // the last one first
    }
    transport->barrier();
  });
  ASSERT_EQ(errors, "");
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], message(static_cast<int>(i), sizes[i]))) << "message " << i;
  }
  for (int i = 0; i < kMany; ++i) {
    EXPECT_TRUE(torch::equal(got[sizes.size() + i], message(100 + i, 1 << 18))) << "many " << i;
  }
}

TEST(Transport, SharedMemoryCarriesWhatGlooCarries) {
  check_messages(/*shared_memory=*/true);
  check_messages(/*shared_memory=*/false);
}

// A rank that turns shared memory off (PPTRAIN_SHM=0 on one rank only) makes its pair fall back
// to Gloo on both ends, and the messages still arrive.
TEST(Transport, SharedMemoryOnOneRankOnlyFallsBackToGlooOnBoth) {
  check_messages(/*shared_memory=*/true, /*only_rank_0=*/true);
}

// A send the ring has no room for is written when the peer has read enough, even while its
// rank waits in a collective and never calls on the ring again (as a Gloo send goes on by
// itself): here rank 1 sends three messages of 3 MiB (the 8 MiB ring holds two) without
// waiting, then joins an all-reduce; rank 0 receives them only later, then joins it.
TEST(Transport, SharedMemorySendsGoOnWhileTheSenderWaitsElsewhere) {
  const int port = find_free_port();
  constexpr int kMessages = 3;
  const int64_t floats = 3 << 18;  // 3 MiB
  std::vector<float> firsts(kMessages, -1.0f);
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    auto transport = connect_transport(pair_options(rank, port, std::chrono::seconds(10), true));
    auto total = torch::ones({1});
    if (rank == 1) {
      std::vector<PendingComm> unsent;
      for (int i = 0; i < kMessages; ++i) {
        unsent.push_back(transport->send(torch::full({floats}, static_cast<float>(i)), 0, 20 + i));
      }
      transport->allreduce_sum(total);
      for (auto& s : unsent) s.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 is in the all-reduce
      for (int i = 0; i < kMessages; ++i) {
        auto buffer = torch::zeros({floats});
        transport->recv(buffer, 1, 20 + i).wait();
        firsts[i] = buffer[0].item<float>();
      }
      transport->allreduce_sum(total);
    }
  });
  ASSERT_EQ(errors, "");
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(firsts[i], static_cast<float>(i)) << i;
}

// A rank waiting for one message leaves the messages whose receives are not posted in the
// ring (as Gloo leaves them with their sender), so that no memory is taken for them earlier
// than the memory model counts it: while the awaited message has not come, and behind it once
// it has. Only those in front of it are copied aside (its receive could not be served
// otherwise), and their receives, posted later, get them.
TEST(Transport, SharedMemoryWaitCopiesAsideOnlyWhatStandsInFront) {
  install_counting_allocator();
  const int port = find_free_port();
  const int64_t large = 1 << 18;  // floats: 1 MiB
  const std::vector<int64_t> floats = {large, 4, large, 4, large};
  const std::vector<int> tags = {7, 8, 10, 11, 12};
  std::vector<float> got(tags.size(), -1.0f);
  int64_t before_it_came = -1, once_it_came = -1;
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    auto transport = connect_transport(pair_options(rank, port, std::chrono::seconds(30), true));
    const auto send = [&](size_t i) {
      transport->send(torch::full({floats[i]}, static_cast<float>(tags[i])), 0, tags[i]).wait();
    };
    std::vector<torch::Tensor> buffers;
    for (int64_t n : floats) buffers.push_back(torch::zeros({n}));
    const auto recv = [&](size_t i) { transport->recv(buffers[i], 1, tags[i]).wait(); };
    transport->barrier();
    // While rank 0 waits for 8, 7 stands in the ring without its receive.
    if (rank == 1) {
      send(0);
      const int64_t before = allocated_bytes();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      before_it_came = allocated_bytes() - before;
      send(1);
    } else {
      recv(1);
      recv(0);
    }
    // 10, 11 and 12 are all in the ring when rank 0 waits for 11: 10 is copied aside, 12 not.
    if (rank == 1) {
      for (size_t i = 2; i < tags.size(); ++i) send(i);
    }
    transport->barrier();
    if (rank == 0) {
      const int64_t before = allocated_bytes();
      recv(3);
      once_it_came = allocated_bytes() - before;
      recv(2);
      recv(4);
      for (size_t i = 0; i < tags.size(); ++i) got[i] = buffers[i][0].item<float>();
    }
    transport->barrier();
  });
  ASSERT_EQ(errors, "");
  EXPECT_LT(before_it_came, large * 4) << "copied aside before the awaited message came";
  EXPECT_GE(once_it_came, large * 4) << "the message in front was not copied aside";
  EXPECT_LT(once_it_came, 2 * large * 4) << "copied aside a message behind the awaited one";
  for (size_t i = 0; i < tags.size(); ++i) EXPECT_EQ(got[i], tags[i]) << "tag " << tags[i];
}

// This process's resident shared memory (RssShmem of /proc/self/status), in bytes.
int64_t resident_shared_memory() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssShmem:", 0) == 0) return std::stoll(line.substr(9)) * 1024;
  }
  return -1;
}

// Messages sent one at a time, each received before the next, keep to the front of the ring:
// 16 MiB of them through an 8 MiB ring make far fewer of its pages resident than one lap.
TEST(Transport, SharedMemoryMessagesOneAtATimeKeepToTheRingsFront) {
  const int port = find_free_port();
  constexpr int kMessages = 256;
  const int64_t floats = 1 << 14;  // 64 KiB
  int64_t before = -1, after = -1;
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    auto transport = connect_transport(pair_options(rank, port, std::chrono::seconds(30), true));
    transport->barrier();
    if (rank == 0) before = resident_shared_memory();
    transport->barrier();
    auto buffer = torch::zeros({floats});
    for (int i = 0; i < kMessages; ++i) {
      if (rank == 0) {
        transport->send(torch::full({floats}, static_cast<float>(i)), 1, 3).wait();
        transport->recv(buffer, 1, 4).wait();  // the answer: the message was taken
      } else {
        transport->recv(buffer, 0, 3).wait();
        if (buffer[0].item<float>() != static_cast<float>(i)) throw std::runtime_error("order");
        transport->send(buffer, 0, 4).wait();
      }
    }
    transport->barrier();
    if (rank == 0) after = resident_shared_memory();
    transport->barrier();
  });
  ASSERT_EQ(errors, "");
  ASSERT_GE(before, 0);
  // Both rings, mapped by both threads: one lap would be 4 x 8 MiB; the front is a few pages.
  EXPECT_LT(after - before, 2 << 20) << before << " -> " << after;
}

// A receive on shared memory whose message never comes fails after the timeout, in the words
// of a Gloo receive's.
TEST(Transport, SharedMemoryReceiveTimesOutNamingThePeer) {
  const int port = find_free_port();
  std::string error;
  const std::string errors = testing::run_rank_threads(2, [&](int rank) {
    auto transport = connect_transport(pair_options(rank, port, std::chrono::seconds(5), true));
    // Both ranks wait in vain; no collective after it, whose own timeout a loaded machine could
    // make it miss.
    try {
      transport->recv(torch::zeros({4}), 1 - rank, 9).wait();
    } catch (const std::exception& e) {
      if (rank == 0) error = e.what();
    }
  });
  ASSERT_EQ(errors, "");
  EXPECT_EQ(error.rfind("receive from rank 1: no answer within 5 s", 0), 0u) << error;
}

TEST(Transport, FromEnvNamesWhatIsMissing) {
  unsetenv("RANK");
  try {
    TransportOptions::from_env();
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK"), std::string::npos);
  }
}

// Shared memory is on unless PPTRAIN_SHM turns it off; a value that is neither on nor off is one
// line.
TEST(Transport, FromEnvReadsPptrainShm) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  unsetenv("PPTRAIN_SHM");
  EXPECT_TRUE(TransportOptions::from_env().shared_memory);
  for (const char* off : {"0", "off"}) {
    setenv("PPTRAIN_SHM", off, 1);
    EXPECT_FALSE(TransportOptions::from_env().shared_memory) << off;
  }
  for (const char* on : {"1", "on"}) {
    setenv("PPTRAIN_SHM", on, 1);
    EXPECT_TRUE(TransportOptions::from_env().shared_memory) << on;
  }
  setenv("PPTRAIN_SHM", "yes", 1);
  try {
    TransportOptions::from_env();
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "PPTRAIN_SHM='yes' is not 1, on, 0 or off");
  }
  for (const char* name : {"PPTRAIN_SHM", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
}

}  // namespace
}  // namespace pptrain
