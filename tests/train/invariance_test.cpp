// Batch invariance end to end (runtime.invariance = "batch"): the field notes' accumulation grid
// gives the same bits in every setting, dropout on, for the MLP and for the char GPT with
// activation checkpointing; without invariance the same grid does not (the control).
#include <gtest/gtest.h>

#include "replay/accum_grid.h"
#include "testing/temp_dir.h"
#include "train/config.h"

namespace retrace {
namespace {

TEST(Invariance, AccumulationGridIsBitwiseWithDropoutOnTheMlp) {
  testing::TempDir tmp;
  const train::Config c = train::parse_config("", "test",
                                              {"train.steps=6", "train.eval_each_epoch=false", "model.dropout=0.2",
                                               "runtime.invariance=batch"});
  const auto rows = replay::accum_grid(c, {1, 2, 4, 8, 16}, tmp.file("grid"));
  ASSERT_EQ(rows.size(), 5u);
  for (const auto& r : rows) {
    EXPECT_TRUE(r.bitwise) << "accum " << r.accum_steps << ": " << r.first_diff;
    EXPECT_EQ(r.max_loss_diff, 0.0) << r.accum_steps;
    EXPECT_EQ(r.compared, 6u);
  }
  // The control: per-micro-batch arithmetic and masks.
  train::Config plain = c;
  plain.runtime.invariance = train::Invariance::kNone;
  const auto ctl = replay::accum_grid(plain, {1, 4}, tmp.file("plain"));
  EXPECT_FALSE(ctl[1].bitwise);
  EXPECT_GT(ctl[1].max_loss_diff, 0.0);
}

TEST(Invariance, AccumulationGridIsBitwiseOnTheCharGptWithActivationCheckpointing) {
  testing::TempDir tmp;
  train::Config c = train::load_config(std::string(RETRACE_SOURCE_DIR) + "/golden/char-gpt-tiny-fast/config.toml",
                                       {"train.steps=4", "train.eval_each_epoch=false", "runtime.invariance=batch",
                                        "runtime.invariance_chunk=2"});
  ASSERT_GT(c.model.dropout, 0.0);
  ASSERT_EQ(c.model.checkpoint, model::CheckpointPolicy::kFull);
  const auto rows = replay::accum_grid(c, {1, 2, 4}, tmp.file("gpt"));
  for (const auto& r : rows) EXPECT_TRUE(r.bitwise) << "accum " << r.accum_steps << ": " << r.first_diff;
}

}  // namespace
}  // namespace retrace
