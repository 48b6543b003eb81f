// The training state of one rank and the operations on it: one step, one evaluation pass, and
// access to every part of the state (model, optimizer, counters, RNG) for digests and checkpoints.
// The loop that drives it (record, resume) lives in run.h.
//
// Determinism: with equal config, data, seed and environment fingerprint, the sequence of
// StepRecords (timings aside) is identical bit for bit.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>

#include "core/tensor_digest.h"
#include "data/fashion_mnist.h"
#include "data/sampler.h"
#include "model/mlp.h"
#include "rng/rng_state.h"
#include "trace/records.h"
#include "train/config.h"
#include "train/schedule.h"

namespace retrace::train {

class Trainer {
 public:
  // Seeds every generator from config.seed, then builds the model (drawing its initial weights)
  // and the optimizer. `data` must outlive the trainer.
  Trainer(const Config& config, const data::FashionMnist& data, uint32_t rank = 0,
          uint32_t world_size = 1);

  // Runs the step at the current cursor and advances. Fills every StepRecord field except the
  // trace writer's digests (content, chain) and timings.trace_ms.
  trace::StepRecord run_step(bool with_digests);
  // Evaluates on the test split (eval mode, no gradients, no RNG draws).
  trace::EvalRecord evaluate();

  uint64_t step() const { return step_; }            // completed optimizer steps
  uint64_t samples_seen() const { return samples_seen_; }
  uint64_t total_steps() const { return total_steps_; }
  const data::Cursor& cursor() const { return cursor_; }
  uint64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const Config& config() const { return config_; }
  model::Mlp& model() { return model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

  NamedTensors model_state() const;    // parameters and buffers, by name
  NamedTensors optimizer_state();      // see optimizer.h
  rng::RngState rng_state() const;     // torch generators + cursor
  Digest128 param_digest() const;
  Digest128 optimizer_digest();
  Digest128 rng_digest() const;
  std::vector<trace::ParamInfo> param_info() const;

  // Restores counters, cursor and RNG (used by resume). Model and optimizer are restored through
  // load_model_state / load_optimizer_state.
  void restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen);
  void load_model_state(const NamedTensors& state);
  void load_optimizer_state(const NamedTensors& state);

 private:
  Config config_;
  const data::FashionMnist& data_;
  data::Sampler sampler_;
  model::Mlp model_{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  uint64_t total_steps_;
  uint64_t step_ = 0;
  uint64_t samples_seen_ = 0;
  data::Cursor cursor_;
};

uint64_t total_steps_for(const Config& c, uint64_t batches_per_epoch);

}  // namespace retrace::train
