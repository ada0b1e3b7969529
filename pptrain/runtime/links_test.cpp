#include "pptrain/runtime/links.h"

#include <gtest/gtest.h>

namespace pptrain {
namespace {

RankPlace cpu(const std::string& host, bool shm = true) {
  return {host, -1, shm};
}
RankPlace gpu(const std::string& host, int device, bool shm = true) {
  return {host, device, shm};
}

TEST(ChooseLink, CpuRanksOfOneHostShareMemoryWhenBothAllowIt) {
  EXPECT_EQ(choose_link(cpu("a"), cpu("a"), true), LinkKind::kShm);
  EXPECT_EQ(choose_link(cpu("a"), cpu("a", false), true), LinkKind::kGloo);
  EXPECT_EQ(choose_link(cpu("a", false), cpu("a"), false), LinkKind::kGloo);
  EXPECT_EQ(choose_link(cpu("a"), cpu("b"), true), LinkKind::kGloo);
}

TEST(ChooseLink, DistinctGpusTakeNcclWhereItIsAvailable) {
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("a", 1), true), LinkKind::kNccl);
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("b", 0), true), LinkKind::kNccl);  // other hosts
  // Without NCCL (a wheel built without it) the tensors cross through the host.
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("a", 1), false), LinkKind::kStagedShm);
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("b", 0), false), LinkKind::kStagedGloo);
}

// NCCL refuses two ranks on one device: their messages go through the host, in shared memory
// when both ranks allow it. A CUDA rank and a CPU rank too.
TEST(ChooseLink, RanksSharingAGpuOrMixingCpuAndGpuStageThroughTheHost) {
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("a", 0), true), LinkKind::kStagedShm);
  EXPECT_EQ(choose_link(gpu("a", 0), gpu("a", 0, false), true), LinkKind::kStagedGloo);
  EXPECT_EQ(choose_link(gpu("a", 0), cpu("a"), true), LinkKind::kStagedShm);
  EXPECT_EQ(choose_link(cpu("b"), gpu("a", 0), true), LinkKind::kStagedGloo);
  EXPECT_TRUE(host_staged(LinkKind::kStagedShm));
  EXPECT_TRUE(host_staged(LinkKind::kStagedGloo));
  EXPECT_FALSE(host_staged(LinkKind::kShm));
  EXPECT_FALSE(host_staged(LinkKind::kNccl));
  EXPECT_EQ(staged(LinkKind::kShm), LinkKind::kStagedShm);
  EXPECT_EQ(staged(LinkKind::kGloo), LinkKind::kStagedGloo);
  EXPECT_EQ(staged(LinkKind::kLocal), LinkKind::kLocal);
}

TEST(LinkTable, DescribesThePairsGroupedByLinkAndShowsEndsThatDisagree) {
  LinkTable links(4);
  for (int r = 0; r < 4; ++r) {
    for (int peer = 0; peer < 4; ++peer) {
      links.set(r, peer, r == peer ? LinkKind::kLocal : LinkKind::kShm);
    }
  }
  links.set(1, 2, LinkKind::kGloo);
  links.set(2, 1, LinkKind::kGloo);
  links.set(3, 2, LinkKind::kGloo);  // 2 says shm, 3 says gloo
  EXPECT_EQ(links.describe({{0, 1}, {1, 2}, {2, 3}}),
            "links: shm between ranks 0-1; gloo between ranks 1-2; shm/gloo between ranks 2-3");
  EXPECT_EQ(links.describe({{0, 1}, {0, 3}}), "links: shm between ranks 0-1, 0-3");
  EXPECT_EQ(links.describe({}), "links: none (one rank)");
  EXPECT_EQ(links.pair_name(2, 3), "shm/gloo");
}

// The codes a sum over the ranks combines: each rank its own row, zeros (kNone) elsewhere.
TEST(LinkTable, RowsSummedFromEachRankMakeTheWholeTable) {
  const int world = 3;
  std::vector<int64_t> sum(world * world, 0);
  for (int r = 0; r < world; ++r) {
    LinkTable mine(world);
    for (int peer = 0; peer < world; ++peer) {
      const LinkKind kind = r + peer == 3 ? LinkKind::kGloo : LinkKind::kShm;
      mine.set(r, peer, peer == r ? LinkKind::kLocal : kind);
    }
    const std::vector<int64_t> codes = mine.codes();
    for (size_t i = 0; i < codes.size(); ++i) sum[i] += codes[i];
  }
  const LinkTable table = LinkTable::from_codes(world, sum);
  EXPECT_EQ(table.at(1, 2), LinkKind::kGloo);
  EXPECT_EQ(table.at(2, 1), LinkKind::kGloo);
  EXPECT_EQ(table.at(0, 2), LinkKind::kShm);
  EXPECT_EQ(table.at(1, 1), LinkKind::kLocal);
  EXPECT_EQ(table.codes(), sum);
}

}  // namespace
}  // namespace pptrain
