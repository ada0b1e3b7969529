// Test helpers for the job room: a small run of gpt to plan.
//
//   TrainOptions options = testing::small_gpt(/*blocks=*/4, /*seq_len=*/8, /*pp=*/3);
#pragma once

#include "pptrain/train/plan.h"

namespace pptrain::testing {

// gpt of `blocks` blocks (d_model 32, 4 heads), 2 steps of 4 microbatches of 2 samples on `pp`
// ranks.
inline TrainOptions small_gpt(int blocks, int seq_len, int pp) {
  TrainOptions options;
  options.model.kind = "gpt";
  options.model.layers = blocks;
  options.model.d_model = 32;
  options.model.heads = 4;
  options.model.seq_len = seq_len;
  options.data.batch_size = 8;
  options.data.microbatches = 4;
  options.pp = pp;
  options.steps = 2;
  return options;
}

}  // namespace pptrain::testing
