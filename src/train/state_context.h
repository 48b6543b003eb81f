// What a checkpoint reads from and writes into a rank's TrainState (state.h), and what it must
// know of the rank besides the state: the ckpt part's one view of training (ckpt/train_state.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor_digest.h"
#include "rng/rng_state.h"
#include "train/config.h"
#include "train/state.h"

namespace retrace::train {

struct StateContext {
  uint32_t rank = 0, world_size = 1;
  uint64_t seed = 0;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int cuda_device = -1;            // cuda_index(config.runtime): -1 on the CPU
  std::string config_hash;         // resolved_config.h: what a checkpoint holds and a restore compares
  uint64_t batches_per_epoch = 0;  // of this rank's sampler: a restored cursor lies inside an epoch
  uint64_t samples_per_step = 0;   // of the global batch: a restored samples_seen is at most steps x it
  bool invariant = false;          // runtime.invariance = "batch": the streams depend on (seed, step) alone
};

// The seed of rank `rank`'s torch generators after the model is built: `seed` itself on rank 0
// (one process is unchanged), else a SplitMix64 mix of the seed and the rank.
uint64_t rank_seed(uint64_t seed, uint32_t rank);

// The optimizer's state as a checkpoint holds it (optimizer.h). Under ZeRO (zero.h) this rank's
// slices of it, each one's place in its whole tensor in `slices` when given (cleared without ZeRO:
// the tensors are whole).
NamedTensors optimizer_state_of(TrainState& s, const StateContext& c, std::vector<SliceOf>* slices = nullptr);
// `adopt`: the tensors of `state` are the caller's to give away (nobody else holds them): taken as
// the optimizer's own where they are on its parameter's device, not copied (load_optimizer_state).
void load_optimizer_state_of(TrainState& s, const StateContext& c, const NamedTensors& state, bool adopt = false);

// Restores counters, cursor and torch's generators (resume, rollback) after checking that the
// cursor and the samples seen fit this run (FormatError otherwise). Model and optimizer: their own.
void restore_position(TrainState& s, const StateContext& c, uint64_t step, const rng::RngState& rng,
                      uint64_t samples_seen);

}  // namespace retrace::train
