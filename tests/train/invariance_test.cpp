// Batch invariance end to end (runtime.invariance = "batch"): the field notes' accumulation grid
// gives the same bits in every setting, dropout on, for the MLP and for the char GPT with
// activation checkpointing; without invariance the same grid does not (the control).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "model/lanes.h"
#include "model/mlp.h"
#include "model/owned_linear.h"
#include "replay/accum_grid.h"
#include "rng/rng_state.h"
#include "testing/temp_dir.h"
#include "train/config.h"
#include "train/invariant.h"
#include "train/registry.h"
#include "train/step.h"

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

// Batch invariance in one piece (model/chunk_layout.h) against the piecewise path it replaces, on
// train_step itself: the same loss bits, micro-batch losses and gradients, with the loss computed
// once per micro-batch instead of once per chunk. Two micro-batches, so the second folds into the
// first's .grad; chunks of 4 rows (folded by BLIS's accumulating call) and of 300 (computed apart
// and added: beyond one k panel).
struct ChunkKeys : train::StepCalls {
  void before_chunk(uint64_t chunk) override { rng::seed_cpu_and_device(train::chunk_seed(5, 3, chunk), -1); }
};

struct OnePiece {
  float loss = 0;
  std::vector<double> micro_losses;
  std::vector<torch::Tensor> grads;
  int loss_calls = 0;
};

enum class Path { kPiecewise, kOnePiece, kPlain };

OnePiece step_mlp(int64_t chunk, Path path) {
  rng::seed_cpu_and_device(17, -1);
  model::MlpOptions o;
  o.inputs = 20;
  o.hidden = {32, 16};
  o.outputs = 5;
  o.dropout = 0.25;
  auto mlp = std::make_shared<model::MlpImpl>(o);
  mlp->train();
  const torch::Tensor x = torch::randn({4 * chunk, 20});
  const torch::Tensor y = torch::randint(0, 5, {4 * chunk}, torch::kInt64);
  const std::vector<train::MicroBatch> micro = {{x.slice(0, 0, 2 * chunk), y.slice(0, 0, 2 * chunk)},
                                                {x.slice(0, 2 * chunk, 4 * chunk), y.slice(0, 2 * chunk, 4 * chunk)}};
  OnePiece out;
  ChunkKeys keys;
  train::StepPolicy policy;
  policy.calls = &keys;
  policy.chunk = path == Path::kPlain ? 0 : chunk;
  policy.chunked_sums = path == Path::kOnePiece;
  policy.max_norm = 0;
  policy.loss = [&out](const torch::Tensor& logits, const torch::Tensor& targets) {
    ++out.loss_calls;
    return train::cross_entropy_sum(logits, targets);
  };
  torch::optim::SGD sgd(mlp->parameters(), torch::optim::SGDOptions(0.0));
  const train::StepResult r = train::train_step(
      *mlp, [&](const torch::Tensor& in) { return mlp->forward(in); }, sgd, micro, policy);
  out.loss = r.loss;
  out.micro_losses = r.micro_losses;
  for (const auto& p : mlp->parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

TEST(Invariance, OnePieceGivesThePiecewiseBitsOnTheMlp) {
  model::set_gemm_path(model::GemmPath::kOwned);
  const int lanes = model::lanes();
  model::set_lanes(2);
  for (const int64_t chunk : {4, 256, 300}) {
    const OnePiece piecewise = step_mlp(chunk, Path::kPiecewise);
    const OnePiece one = step_mlp(chunk, Path::kOnePiece);
    EXPECT_EQ(piecewise.loss_calls, 4) << chunk;  // 2 micro-batches of 2 chunks: per chunk
    EXPECT_EQ(one.loss_calls, 2) << chunk;        // per micro-batch
    EXPECT_EQ(piecewise.loss, one.loss) << chunk;
    EXPECT_EQ(piecewise.micro_losses, one.micro_losses) << chunk;
    ASSERT_EQ(piecewise.grads.size(), one.grads.size());
    for (size_t i = 0; i < one.grads.size(); ++i)
      EXPECT_TRUE(torch::equal(piecewise.grads[i], one.grads[i])) << "chunk " << chunk << ", parameter " << i;
  }
  // The control: without invariance (one sum per micro-batch, masks from torch's generator) the
  // same step gives other gradients, so the comparison above can fail.
  const OnePiece piecewise = step_mlp(4, Path::kPiecewise);
  const OnePiece plain = step_mlp(4, Path::kPlain);
  bool all_same = true;
  for (size_t i = 0; i < plain.grads.size(); ++i)
    all_same = all_same && torch::equal(piecewise.grads[i], plain.grads[i]);
  EXPECT_FALSE(all_same);
  model::set_lanes(lanes);
  model::set_gemm_path(model::GemmPath::kAten);
}

}  // namespace
}  // namespace retrace
