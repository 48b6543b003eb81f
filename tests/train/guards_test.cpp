#include "train/guards.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace retrace::train {
namespace {

TEST(SkipRateGuard, WarnsOnceWhenTheRatePassesTheThresholdAndReArms) {
  SkipRateGuard g(/*window=*/100, /*warn_rate=*/0.05);
  int warnings = 0;
  uint64_t step = 0;
  // 49 outcomes with 10 skips: not judged yet (fewer than min(window, 50) outcomes).
  for (int i = 0; i < 49; ++i) warnings += g.record(i < 10, ++step).has_value();
  EXPECT_EQ(warnings, 0);
  // The 50th outcome makes the rate 10 / 50 = 20 % > 5 %: one warning, then quiet.
  warnings += g.record(false, ++step).has_value();
  EXPECT_EQ(warnings, 1);
  for (int i = 0; i < 10; ++i) warnings += g.record(true, ++step).has_value();
  EXPECT_EQ(warnings, 1);
  // Many clean steps push the rate under 5 % (the window drops the old skips): re-armed.
  for (int i = 0; i < 200; ++i) warnings += g.record(false, ++step).has_value();
  EXPECT_LT(g.rate(), 0.05);
  for (int i = 0; i < 10; ++i) warnings += g.record(true, ++step).has_value();
  EXPECT_EQ(warnings, 2);
}

TEST(SkipRateGuard, StateRoundTrip) {
  SkipRateGuard a(10, 0.05), b(10, 0.05);
  for (int i = 0; i < 7; ++i) a.record(i % 3 == 0, i + 1);
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_DOUBLE_EQ(b.rate(), a.rate());
  EXPECT_THROW(b.load_state({{"skip_guard.outcomes", "01x"}, {"skip_guard.warned", "0"}}), FormatError);
}

TEST(SpikeGuard, MedianLevelAndFactor) {
  SpikeGuard g(/*factor=*/2.0, /*window=*/5);
  for (double l : {1.0, 1.2, 0.8, 1.1}) g.record(l);
  EXPECT_FALSE(g.level().has_value());  // fewer than `window` losses: no judgement
  EXPECT_FALSE(g.is_spike(100.0));
  g.record(0.9);
  ASSERT_TRUE(g.level().has_value());
  EXPECT_DOUBLE_EQ(*g.level(), 1.0);  // median of 0.8 0.9 1.0 1.1 1.2
  EXPECT_FALSE(g.is_spike(2.0));
  EXPECT_TRUE(g.is_spike(2.0001));
  g.record(50.0);  // one outlier moves a median only by a rank
  EXPECT_DOUBLE_EQ(*g.level(), 1.1);
  SpikeGuard off(0.0, 5);
  EXPECT_FALSE(off.enabled());
  SpikeGuard c(2.0, 5);
  c.load_state(g.state());
  EXPECT_EQ(c.state(), g.state());
}

}  // namespace
}  // namespace retrace::train
