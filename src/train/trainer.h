// The training state of one rank and the operations on it: one step, one evaluation pass, and
// access to every part of the state (model, optimizer, counters, RNG, scaler, guards) for digests
// and checkpoints. The loop that drives it (record, resume, rollback) lives in run.h.
//
// Determinism: with equal config, data, seed and environment fingerprint, the sequence of
// StepRecords (timings aside) is identical bit for bit.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <set>
#include <utility>

#include "core/tensor_digest.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "model/gpt.h"
#include "model/model.h"
#include "rng/rng_state.h"
#include "records/records.h"
#include "train/config.h"
#include "train/guards.h"
#include "train/loss_scaler.h"
#include "train/schedule.h"
#include "train/probe.h"
#include "train/registry.h"
#include "train/step.h"

namespace retrace::train {


class Trainer {
 public:
  // Seeds every generator from config.seed, then builds the model (from the factory `registry`
  // has for model.kind) and the optimizer, and checks that the model fits the data and the loss
  // (check_model_fits). `data` must outlive the trainer; the registry need not.
  Trainer(const Config& config, const data::Dataset& data, const Registry& registry = builtin_registry(),
          uint32_t rank = 0, uint32_t world_size = 1);

  // Runs the step at the current cursor (skipping batches set aside by a rollback) and advances.
  // Fills every StepRecord field except the trace writer's digests and timings.trace_ms.
  records::StepRecord run_step(bool with_digests);
  // Evaluates on the test split (eval mode, no gradients, no RNG draws).
  records::EvalRecord evaluate();
  // Messages for the trace (kind, text) produced since the last call: guard warnings, faults.
  std::vector<std::pair<std::string, std::string>> take_events();

  uint64_t step() const { return step_; }  // completed (applied or skipped) steps
  uint64_t samples_seen() const { return samples_seen_; }
  uint64_t total_steps() const { return total_steps_; }
  const data::Cursor& cursor() const { return cursor_; }
  uint64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const Config& config() const { return config_; }
  torch::nn::Module& module() { return *model_.module; }
  const model::ModelHandle& model() const { return model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const LossScaler& scaler() const { return scaler_; }
  uint32_t rank() const { return rank_; }
  torch::Device device() const;  // runtime.device: CPU, or CUDA device LOCAL_RANK
  uint32_t world_size() const { return world_size_; }

  NamedTensors model_state() const;  // parameters and buffers, by name
  NamedTensors optimizer_state();    // see optimizer.h
  rng::RngState rng_state() const;   // torch generators + cursor
  Digest128 param_digest() const;
  Digest128 optimizer_digest();
  Digest128 rng_digest() const;
  std::vector<records::ParamInfo> param_info() const;

  // State of the step's policies (scaler, guards, fired faults, batches set aside) as strings.
  std::map<std::string, std::string> policy_state() const;
  void load_policy_state(const std::map<std::string, std::string>& state);
  // Restores counters, cursor and RNG (resume, rollback). Model and optimizer: load_*_state.
  void restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen);
  void load_model_state(const NamedTensors& state);
  void load_optimizer_state(const NamedTensors& state);
  // After a rollback: skip the spiking batch and the `count - 1` batches before it.
  void set_aside_batches(const data::Cursor& spike, int64_t count);
  const std::set<std::pair<uint64_t, uint64_t>>& set_aside() const { return skip_batches_; }
  // Marks a once-only fault as fired (crash faults are marked from the run directory on resume).
  void mark_fired(const std::string& fault_id) { fired_.insert(fault_id); }
  bool fault_due(const std::string& kind, uint64_t step, std::string* arg = nullptr) const;

  // The hook run after the last micro-batch's backward (data-parallel all-reduce).
  void set_after_last_backward(std::function<void()> hook) { after_last_backward_ = std::move(hook); }
  // Bisection's probe for the next steps (nullptr: none). Not owned.
  void set_probe(StepProbe* probe) {
    probe_ = probe;
    if (model_.set_probe) model_.set_probe(probe);
  }
  // Data parallelism: the sum of a loss over the ranks (see StepPolicy::reduce_loss).
  void set_reduce_loss(std::function<float(float)> reduce) { reduce_loss_ = std::move(reduce); }

 private:
  StepFaults faults_for(uint64_t step);
  void apply_perturbation(uint64_t step);

  Config config_;
  const data::Dataset& data_;
  uint32_t rank_, world_size_;
  data::Sampler sampler_;
  model::ModelHandle model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  LossScaler scaler_;
  SkipRateGuard skip_guard_;
  SpikeGuard spike_guard_;
  std::vector<records::Fault> faults_;
  std::set<std::string> fired_;
  std::set<std::pair<uint64_t, uint64_t>> skip_batches_;  // (epoch, batch_in_epoch)
  std::vector<std::pair<std::string, std::string>> events_;
  std::function<void()> after_last_backward_;
  std::function<float(float)> reduce_loss_;
  LossFn loss_;
  StepProbe* probe_ = nullptr;
  uint64_t total_steps_;
  uint64_t step_ = 0;
  uint64_t samples_seen_ = 0;
  data::Cursor cursor_;
};

uint64_t total_steps_for(const Config& c, uint64_t batches_per_epoch);
at::ScalarType autocast_dtype(const Config& c);
bool scaler_enabled(const Config& c);

}  // namespace retrace::train
