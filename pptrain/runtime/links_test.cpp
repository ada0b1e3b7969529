#include "pptrain/runtime/links.h"

#include <gtest/gtest.h>

namespace pptrain {
namespace {

// A rank on a GPU packs its messages into host memory: its CPU path becomes host-staged.
TEST(Staged, TheCpuPathsOfARankOnAGpuCrossThroughTheHost) {
  EXPECT_EQ(staged(LinkKind::kShm), LinkKind::kStagedShm);
  EXPECT_EQ(staged(LinkKind::kGloo), LinkKind::kStagedGloo);
  EXPECT_EQ(staged(LinkKind::kLocal), LinkKind::kLocal);
  EXPECT_EQ(staged(LinkKind::kNccl), LinkKind::kNccl);
  EXPECT_STREQ(link_name(LinkKind::kStagedShm), "host-staged shm");
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
