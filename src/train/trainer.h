// A rank's training: its TrainState (state.h), the Policies chosen from the config (policies.h),
// the sampler that yields its batches, and the other ranks (a Collective, collective.h). run_step() is
// step_state() on the next batch; the rest gives access to the state for digests, checkpoints,
// rollback and resume. The loop that drives it (record, resume, rollback) lives in run/run.h.
//
// Determinism: with equal config, data, seed and environment fingerprint, the sequence of
// StepRecords (timings aside) is identical bit for bit.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "core/tensor_digest.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "model/model.h"
#include "records/records.h"
#include "rng/rng_state.h"
#include "train/collective.h"
#include "train/config.h"
#include "train/resolved_config.h"
#include "train/policies.h"
#include "train/probe.h"
#include "train/registry.h"
#include "train/state.h"
#include "train/step_state.h"

namespace retrace::train {

// The seed of rank `rank`'s torch generators after the model is built: `seed` itself on rank 0
// (one process is unchanged), else a SplitMix64 mix of the seed and the rank.
uint64_t rank_seed(uint64_t seed, uint32_t rank);

class Trainer {
 public:
  // Seeds every generator from config.seed, then builds the model (from the factory `registry`
  // has for model.kind) and the optimizer, and checks that the model fits the data and the loss
  // (check_model_fits). Then, on a rank other than 0, re-keys torch's generators with
  // rank_seed(seed, rank): every rank starts from the same parameters and draws its own dropout
  // masks. `data` and `ranks` (the other ranks of a data-parallel run, nullptr for one process)
  // must outlive the trainer; the registry need not.
  Trainer(const ResolvedConfig& config, const data::Dataset& data, const Registry& registry = builtin_registry(),
          Collective* ranks = nullptr);
  // A config whose thread counts are resolved (tests, benchmarks): its texts and hash are made here.
  Trainer(const Config& config, const data::Dataset& data, const Registry& registry = builtin_registry(),
          Collective* ranks = nullptr);

  // The next batch at the cursor (skipping batches set aside by a rollback), on the device.
  Batch next_batch();
  // step_state() on next_batch(). Fills every StepRecord field except the trace writer's
  // digests and timings.trace_ms; the step's events wait in take_events().
  records::StepRecord run_step(bool with_digests);
  // Evaluates the first eval.max_batches batches of the test split (config.h's eval_plan; eval
  // mode, no gradients, no RNG draws). after_batch, when set, is called after each batch with its
  // number (fault injection).
  records::EvalRecord evaluate(const std::function<void(int64_t)>& after_batch = {});
  // Messages for the trace (kind, text) produced since the last call: guard warnings, faults.
  std::vector<std::pair<std::string, std::string>> take_events();

  const TrainState& state() const { return state_; }
  const Policies& policies() const { return policies_; }
  uint64_t step() const { return state_.step; }  // completed (applied or skipped) steps
  uint64_t samples_seen() const { return state_.samples_seen; }
  uint64_t total_steps() const { return total_steps_; }
  const data::Cursor& cursor() const { return state_.cursor; }
  uint64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  const Config& config() const { return config_.config; }
  // The config's hash (resolved_config.h): what checkpoints hold and a resume compares.
  const std::string& config_hash() const { return config_.hash; }
  torch::nn::Module& module() { return *state_.model.module; }
  const model::ModelHandle& model() const { return state_.model; }
  torch::optim::Optimizer& optimizer() { return *state_.optimizer; }
  const LossScaler& scaler() const { return state_.scaler; }
  uint32_t rank() const { return rank_; }
  torch::Device device() const;  // runtime.device: CPU, or CUDA device LOCAL_RANK
  uint32_t world_size() const { return world_size_; }

  NamedTensors model_state() const { return train::model_state(state_); }
  // See optimizer.h. Under ZeRO (zero.h) this rank's slices of it, each one's place in its whole
  // tensor in `slices` when given (left empty without ZeRO: the tensors are whole).
  NamedTensors optimizer_state(std::vector<SliceOf>* slices = nullptr);
  // runtime.zero_stage = 1: this rank's range of the parameters; null otherwise.
  const ZeroShard* zero() const { return state_.zero.get(); }
  rng::RngState rng_state() const { return train::rng_state(state_, policies_.seed); }
  // As the trace records them (trace.digest_version).
  Digest128 param_digest() const { return digest_named(model_state(), digest_kind()); }

  DigestKind digest_kind() const { return digest_kind_of(policies_.digest_version); }
  Digest128 rng_digest() const;
  Digest128 policy_digest() const { return train::policy_digest(state_); }
  std::vector<records::ParamInfo> param_info() const { return train::param_info(state_); }

  std::map<std::string, std::string> policy_state() const { return train::policy_state(state_); }
  void load_policy_state(const std::map<std::string, std::string>& state) { train::load_policy_state(state_, state); }
  void check_policy_state(const std::map<std::string, std::string>& state) const {
    train::check_policy_state(state_, state);
  }
  // Restores counters, cursor and RNG (resume, rollback). Model and optimizer: load_*_state.
  void restore_position(uint64_t step, const rng::RngState& rng, uint64_t samples_seen);
  void load_model_state(const NamedTensors& state) { train::load_model_state(state_, state); }
  void load_optimizer_state(const NamedTensors& state);
  // After a rollback: skip the spiking batch and the `count - 1` batches before it.
  void set_aside_batches(const data::Cursor& spike, int64_t count) {
    train::set_aside_batches(state_, spike, count, sampler_.batches_per_epoch());
  }
  const std::set<std::pair<uint64_t, uint64_t>>& set_aside() const { return state_.set_aside; }
  // Marks a once-only fault as fired (crash faults are marked from the run directory on resume).
  void mark_fired(const std::string& fault_id) { state_.fired.insert(fault_id); }
  // The crash fault due after `step` (its argument: the rank, or empty for every rank).
  std::optional<std::string> crash_due(uint64_t step) const;
  // Whether a crash-in-eval fault is due in the evaluation after `step`.
  bool crash_in_eval_due(uint64_t step) const {
    return policies_.faults.due(FaultKind::kCrashInEval, step, state_.fired).has_value();
  }

  // Bisection's probe for the next steps (nullptr: none). Not owned.
  void set_probe(StepProbe* probe) {
    probe_ = probe;
    if (state_.model.set_probe) state_.model.set_probe(probe);
  }
  bool invariant() const { return policies_.invariance_chunk > 0; }
  // The other ranks (nullptr: one process).
  Collective* ranks() const { return ranks_; }
  // The invariance property's negative control only: batch invariance's fold as the ranks' own sums.
  void fold_chunks_by_rank_sums() { policies_.chunk_rank_sums = true; }

 private:
  ResolvedConfig config_;
  const data::Dataset& data_;
  Collective* ranks_;
  uint32_t rank_, world_size_;
  data::Sampler sampler_;
  uint64_t total_steps_;
  Policies policies_;
  TrainState state_;
  StepProbe* probe_ = nullptr;
  std::vector<std::pair<std::string, std::string>> events_;
};

}  // namespace retrace::train
