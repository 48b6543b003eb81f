// The training-memory estimator against the field-notes figures and its own documented formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/memory_plan.h"

namespace retrace::model {
namespace {

void expect_within_percent(double got, double want, double percent) {
  EXPECT_LE(std::fabs(got - want), std::fabs(want) * percent / 100.0) << "got " << got << ", want " << want;
}

// Field notes: d = 8192, L = 8192, B = 1, BF16 -> about 1.6 GB per layer, 64 layers about 103 GB.
TEST(MemoryPlan, FieldNotesExample) {
  const MemoryEstimate e = estimate_memory(/*params=*/1000, /*batch=*/1, /*seq=*/8192, /*d_model=*/8192,
                                           /*n_layers=*/64, /*n_heads=*/64, /*dtype_bytes=*/2, "none", 4, 1);
  expect_within_percent(e.activation_bytes_per_layer, 1.61e9, 1.0);
  expect_within_percent(e.activation_bytes_total, 103e9, 1.0);
  EXPECT_EQ(e.activation_bytes_per_layer, 12.0 * 8192 * 8192 * 2);
}

TEST(MemoryPlan, ParamsGradsOptimizerAndZero1) {
  const MemoryEstimate e = estimate_memory(1'000'000'000, 1, 1024, 1024, 8, 8, 2, "none", 4, 8);
  EXPECT_EQ(e.params, 1'000'000'000);
  EXPECT_EQ(e.param_bytes, 2e9);
  EXPECT_EQ(e.grad_bytes, 2e9);
  EXPECT_EQ(e.optimizer_bytes, 8e9);
  EXPECT_EQ(e.zero1_optimizer_bytes_per_rank, 12e9 / 8);
  EXPECT_EQ(e.total_bytes(), e.param_bytes + e.grad_bytes + e.optimizer_bytes + e.activation_bytes_total);
}

TEST(MemoryPlan, CheckpointPolicies) {
  const double btds = 1.0 * 8192 * 8192 * 2;
  const double layer = 12 * btds;
  const MemoryEstimate none = estimate_memory(0, 1, 8192, 8192, 64, 64, 2, "none", 4, 1);
  const MemoryEstimate full = estimate_memory(0, 1, 8192, 8192, 64, 64, 2, "full", 4, 1);
  const MemoryEstimate sqrt_l = estimate_memory(0, 1, 8192, 8192, 64, 64, 2, "sqrt", 4, 1);
  const MemoryEstimate selective = estimate_memory(0, 1, 8192, 8192, 64, 64, 2, "selective", 4, 1);
  // full, k = 4: 16 segment inputs kept plus one segment of 4 layers recomputed at a time.
  EXPECT_EQ(full.segment_length, 4);
  EXPECT_DOUBLE_EQ(full.activation_bytes_total, 16 * btds + 4 * layer);
  // sqrt: k = 8, so 8 segment inputs plus 8 layers.
  EXPECT_EQ(sqrt_l.segment_length, 8);
  EXPECT_DOUBLE_EQ(sqrt_l.activation_bytes_total, 8 * btds + 8 * layer);
  // selective: the attention core share 5hT / (34d + 5hT) is dropped.
  const double f = 5.0 * 64 * 8192 / (34.0 * 8192 + 5.0 * 64 * 8192);
  EXPECT_DOUBLE_EQ(selective.attention_core_fraction, f);
  EXPECT_DOUBLE_EQ(selective.activation_bytes_total, 64 * layer * (1 - f));
  EXPECT_LT(full.activation_bytes_total, none.activation_bytes_total);
  EXPECT_LT(sqrt_l.activation_bytes_total, none.activation_bytes_total);
  EXPECT_GT(selective.activation_bytes_total, 0);
  EXPECT_LT(selective.activation_bytes_total, none.activation_bytes_total);
  // Every policy reports the unscaled per-layer figure.
  EXPECT_EQ(full.activation_bytes_per_layer, none.activation_bytes_per_layer);
  // k larger than the model: one segment holding every layer, plus its input.
  const MemoryEstimate big_k = estimate_memory(0, 1, 128, 128, 4, 4, 4, "full", 16, 1);
  EXPECT_DOUBLE_EQ(big_k.activation_bytes_total, 128.0 * 128 * 4 + 4 * big_k.activation_bytes_per_layer);
}

// Whole copies of the state (the rollback anchor, the staging buffer) add weights and AdamW state
// each, and count in the total.
TEST(MemoryPlan, StateCopiesAddWeightsAndOptimizerStateEach) {
  const MemoryEstimate e = estimate_memory(1'000'000, 2, 64, 128, 4, 4, 4, "none", 4, 1);
  EXPECT_EQ(e.state_copies, 0);
  EXPECT_DOUBLE_EQ(e.state_copy_bytes, 0);
  const MemoryEstimate two = with_state_copies(e, 2);
  EXPECT_EQ(two.state_copies, 2);
  EXPECT_DOUBLE_EQ(two.state_copy_bytes, 2 * (4.0e6 + 8.0e6));
  EXPECT_DOUBLE_EQ(two.total_bytes(), e.total_bytes() + 24.0e6);
  EXPECT_THROW(with_state_copies(e, -1), InvariantError);
}

TEST(MemoryPlan, RejectsBadArguments) {
  EXPECT_THROW(estimate_memory(0, 1, 8, 8, 2, 2, 2, "bogus", 4, 1), ConfigError);
  EXPECT_THROW(estimate_memory(0, 1, 8, 8, 2, 2, 2, "full", 0, 1), ConfigError);
  EXPECT_THROW(estimate_memory(0, 1, 8, 8, 2, 2, 2, "none", 4, 0), ConfigError);
  EXPECT_THROW(estimate_memory(0, 0, 8, 8, 2, 2, 2, "none", 4, 1), ConfigError);
  EXPECT_THROW(estimate_memory(0, 1, 8, 8, 2, 3, 2, "none", 4, 1), ConfigError);
  EXPECT_NO_THROW(estimate_memory(0, 1, 8, 8, 2, 2, 2, "sqrt", 0, 1));  // k only matters for full
}

}  // namespace
}  // namespace retrace::model
