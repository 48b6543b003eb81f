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
#include "train/state_context.h"
#include "train/policies.h"
#include "train/probe.h"
#include "train/registry.h"
#include "train/state.h"
#include "train/step_state.h"

namespace retrace::train {

// How a trainer's model starts. A resume sets `initialize` false: the checkpoint overwrites every
// parameter and restores every generator, so the GPT's initialization draws are skipped.
// `check_fit` false skips check_model_fits' forward (its dtype check stays): safe where the
// recording passed it with the same model code and inputs: a built-in model (mlp, gpt) and loss
// over inputs whose sha256 equal the recorded ones (resume decides, run.cpp).
struct ModelStart {
  bool initialize = true;
  bool check_fit = true;
};

class Trainer {
 public:
  // Seeds every generator from config.seed, then builds the model (from the factory `registry`
  // has for model.kind) and the optimizer, and checks that the model fits the data and the loss
  // (check_model_fits). Then, on a rank other than 0, re-keys torch's generators with
  // rank_seed(seed, rank): every rank starts from the same parameters and draws its own dropout
  // masks. `data` and `ranks` (the other ranks of a data-parallel run, nullptr for one process)
  // must outlive the trainer; the registry need not.
  Trainer(const ResolvedConfig& config, const data::Dataset& data, const Registry& registry = builtin_registry(),
          Collective* ranks = nullptr, ModelStart start = {});
  // A config whose thread counts are resolved (tests, benchmarks): its texts and hash are made here.
  Trainer(const Config& config, const data::Dataset& data, const Registry& registry = builtin_registry(),
          Collective* ranks = nullptr);

  // step_state() on the next batch at the cursor (skipping batches set aside by a rollback). Fills
  // every StepRecord field except the trace writer's digests and timings.trace_ms; the step's
  // events wait in take_events().
  records::StepRecord run_step(bool with_digests);
  // Evaluates the first eval.max_batches batches of the test split (config.h's eval_plan; eval
  // mode, no gradients, no RNG draws). after_batch, when set, is called after each batch with its
  // number (fault injection).
  records::EvalRecord evaluate(const std::function<void(int64_t)>& after_batch = {});
  // Messages for the trace (kind, text) produced since the last call: guard warnings, faults.
  std::vector<std::pair<std::string, std::string>> take_events();

  const TrainState& state() const { return state_; }
  TrainState& state() { return state_; }  // what a checkpoint saves and restores (ckpt/train_state.h)
  // What a checkpoint must know of this rank besides its state.
  StateContext state_context() const;
  uint64_t step() const { return state_.step; }  // completed (applied or skipped) steps
  uint64_t samples_seen() const { return state_.samples_seen; }
  uint64_t total_steps() const { return total_steps_; }
  const data::Cursor& cursor() const { return state_.cursor; }
  const Config& config() const { return config_.config; }
  torch::nn::Module& module() { return *state_.model.module; }
  const model::ModelHandle& model() const { return state_.model; }
  uint32_t rank() const { return rank_; }
  torch::Device device() const;  // runtime.device: CPU, or CUDA device LOCAL_RANK

  // See state_context.h's optimizer_state_of.
  NamedTensors optimizer_state() { return optimizer_state_of(state_, state_context()); }
  rng::RngState rng_state() const { return train::rng_state(state_, policies_.seed); }

  // After a rollback: skip the spiking batch and the `count - 1` batches before it.
  void set_aside_batches(const data::Cursor& spike, int64_t count) {
    train::set_aside_batches(state_, spike, count, sampler_.batches_per_epoch());
  }
  // The crash fault due after `step` (its argument: the rank, or empty for every rank).
  std::optional<std::string> crash_due(uint64_t step) const;
  // Whether a crash-in-eval fault is due in the evaluation after `step`.
  bool crash_in_eval_due(uint64_t step) const {
    return policies_.faults.due(FaultKind::kCrashInEval, step, state_.fired).has_value();
  }
  // Whether a crash-in-save fault is due in the background save of `step`.
  bool crash_in_save_due(uint64_t step) const {
    return policies_.faults.due(FaultKind::kCrashInSave, step, state_.fired).has_value();
  }
  // The tensor a corrupt-staging fault flips in the staging copy of `step`'s save, if one is due.
  std::optional<std::string> corrupt_staging_due(uint64_t step) const {
    auto f = policies_.faults.due(FaultKind::kCorruptStaging, step, state_.fired);
    if (!f) return std::nullopt;
    return (*f)->arg;
  }

  // Bisection's probe for the next steps (nullptr: none). Not owned.
  void set_probe(StepProbe* probe) {
    probe_ = probe;
    if (state_.model.set_probe) state_.model.set_probe(probe);
  }
  // The invariance property's negative control only: batch invariance's fold as the ranks' own sums.
  void fold_chunks_by_rank_sums() { policies_.chunk_rank_sums = true; }

 private:
  // The next batch at the cursor (skipping batches set aside by a rollback), on the device.
  Batch next_batch();

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
