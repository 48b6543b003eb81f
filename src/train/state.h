// The training state of one rank as a value: everything a step changes and a checkpoint holds
// (model, optimizer, loss scaler, guards, fired faults, batches set aside, counters, data cursor;
// the LR schedule's position is `step`; torch's generators are the process's, captured by
// rng_state). A step is a function of it (step_state.h); the loop only sequences steps.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/tensor_digest.h"
#include "data/sampler.h"
#include "model/model.h"
#include "records/records.h"
#include "rng/rng_state.h"
#include "train/guards.h"
#include "train/loss_scaler.h"

namespace retrace::train {

class ZeroShard;

struct TrainState {
  model::ModelHandle model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  LossScaler scaler;
  SkipRateGuard skip_guard;
  SpikeGuard spike_guard;
  std::set<std::string> fired;                        // once-only faults that fired ("spike@17")
  std::set<std::pair<uint64_t, uint64_t>> set_aside;  // (epoch, batch_in_epoch) skipped after a rollback
  uint64_t step = 0;                                  // completed (applied or skipped) steps
  uint64_t samples_seen = 0;
  data::Cursor cursor;  // the next batch
  // runtime.zero_stage = 1: this rank's range of the parameters, over whose views the optimizer
  // was built (zero.h); null otherwise.
  std::shared_ptr<ZeroShard> zero;
  // The last traced step's digest shares by tensor (when its digests were taken tensor by tensor).
  StepDigestParts digest_parts;
};

// A module's parameters, then its buffers, by name; and their names, shapes and dtypes.
NamedTensors module_tensors(const torch::nn::Module& m);
std::vector<records::ParamInfo> param_info(const torch::nn::Module& m);
// The same of named tensors (parameters, then buffers), in their order.
std::vector<records::ParamInfo> param_info(const NamedTensors& tensors);

// Parameters and buffers by name.
NamedTensors model_state(const TrainState& s);
// Every random stream: torch's generators and the cursor.
rng::RngState rng_state(const TrainState& s, uint64_t seed);
// The CUDA device index the module's parameters live on, -1 when they are on the CPU.
int cuda_index(const torch::nn::Module& module);
std::vector<records::ParamInfo> param_info(const TrainState& s);

// The policies' state (scaler, guards, fired faults, batches set aside) as strings, for the
// checkpoint's metadata, and back (FormatError for a damaged value).
std::map<std::string, std::string> policy_state(const TrainState& s);
void load_policy_state(TrainState& s, const std::map<std::string, std::string>& state);
// load_policy_state into copies of s's policies, s left as it is: FormatError for any damaged value
// (the validation layer's check before a checkpoint is applied).
void check_policy_state(const TrainState& s, const std::map<std::string, std::string>& state);
// Digest of everything a later step depends on besides model, optimizer and RNG: the policy
// state above and samples_seen (StepRecord::state_digest).
Digest128 policy_digest(const TrainState& s);
// FormatError naming the tensor when one is missing or of another shape or dtype.
void load_model_state(TrainState& s, const NamedTensors& state);
// That `state` holds every tensor of `model` (a model's parameters and buffers) by name, of its
// dtype and shape: FormatError naming `where` and the tensor otherwise. load_model_state's check,
// and the validation layer's (which also refuses tensors the model lacks).
void check_model_state(const NamedTensors& model, const NamedTensors& state, const std::string& where);
// After a rollback: skip the spiking batch and the `count - 1` batches before it.
void set_aside_batches(TrainState& s, const data::Cursor& spike, int64_t count, uint64_t batches_per_epoch);

}  // namespace retrace::train
