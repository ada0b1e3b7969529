#include "pptrain/schedule/grid.h"

#include <gtest/gtest.h>

#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

TEST(Grid, AlignsStepsAndMarksOneAction) {
  Schedule s = lower(parse_csv("0F0,0B0\n1F0,1B0\n"));
  EXPECT_EQ(render_grid(s, {1, 2}),
            "rank 0 | 0F0       0SEND_F0  0RECV_B0  0B0\n"
            "rank 1 | 1RECV_F0  1F0      [1B0]      1SEND_B0\n");
  GridOptions compute_only;
  compute_only.with_comms = false;
  EXPECT_EQ(render_grid(s, compute_only), "rank 0 | 0F0  0B0\nrank 1 | 1F0  1B0\n");
}

}  // namespace
}  // namespace pptrain
