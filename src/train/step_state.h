// One training step as a function of (state, batch, policies): it returns the step's record and
// its events and leaves the state advanced by one step. The order inside is step.h's; faults are
// applied where faults.h says.
//
// Determinism: with equal state (including torch's generators), batch and policies, the record
// (timings aside) and the next state are equal bit for bit.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/sampler.h"
#include "records/records.h"
#include "train/policies.h"
#include "train/state.h"

namespace retrace::train {

class StepProbe;

// The samples of one step on this rank, already on the device.
struct Batch {
  data::Cursor at;               // the cursor of this batch
  data::Cursor next;             // the cursor after it
  std::vector<int64_t> indices;  // sample indices, in order
  torch::Tensor inputs, targets;
  uint64_t global_samples = 0;   // samples of the effective batch over all ranks (0: this rank's)
  uint64_t global_offset = 0;    // where this rank's samples start in the global batch
  double data_ms = 0;            // time taken to gather it
};

// What the step calls out to: the data-parallel all-reduce after the last backward, the loss sum
// over ranks, and bisection's probe.
struct StepHooks {
  std::function<void()> after_last_backward;
  std::function<float(float)> reduce_loss;
  // Batch invariance under data parallelism (train/invariant.h): after each chunk's backward, and
  // the step's loss from this rank's chunk losses. Unset: one rank (autograd's accumulation and a
  // local fold are already the global fold).
  std::function<void()> step_start;
  std::function<void()> after_chunk_backward;
  std::function<float(const std::vector<float>&)> fold_losses;
  // ZeRO under data parallelism (train/zero.h): the parameters all-gathered after an applied
  // step, and the digests' sums added over the ranks. Unset: one rank.
  std::function<void()> after_optimizer_step;
  std::function<std::vector<uint64_t>(const std::vector<uint64_t>&)> sum_over_ranks;
  // ZeRO's reduce-scatter (runtime.zero_reduce): after_last_backward left this rank its range's
  // reduced gradients only, and this gives the global gradient norm from every rank's part.
  // Unset: every rank holds the whole reduced gradient.
  std::function<double()> grad_norm;
  StepProbe* probe = nullptr;
};

struct StepOutput {
  records::StepRecord record;  // every field but the trace writer's digests and timings.trace_ms
  std::vector<std::pair<std::string, std::string>> events;  // (kind, text): faults, guard warnings
};

StepOutput step_state(TrainState& state, const Batch& batch, const Policies& policies, const StepHooks& hooks,
                      bool with_digests);

}  // namespace retrace::train
