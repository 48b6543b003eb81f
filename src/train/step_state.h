// One training step as a function of (state, batch, policies): it returns the step's record and
// its events and leaves the state advanced by one step. The order inside is step.h's; faults are
// applied where faults.h says.
//
// Determinism: with equal state (including torch's generators), batch and policies, the record
// (timings aside) and the next state are equal bit for bit.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "data/sampler.h"
#include "records/records.h"
#include "train/collective.h"
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
  uint64_t global_samples = 0;  // samples of the effective batch over all ranks (0: this rank's)
  uint64_t global_offset = 0;   // where this rank's samples start in the global batch
  double data_ms = 0;           // time taken to gather it
};

struct StepOutput {
  records::StepRecord record;  // every field but the trace writer's digests and timings.trace_ms
  std::vector<std::pair<std::string, std::string>> events;  // (kind, text): faults, guard warnings
};

// `ranks`: the other ranks of a data-parallel run (data_parallel.h), nullptr for one process; the
// record then holds every rank's gradient digests (and, with digests at trace.digest_version 2 or
// more, every rank's RNG digest) and the step's collectives. `probe`: bisection's, or nullptr.
StepOutput step_state(TrainState& state, const Batch& batch, const Policies& policies, Collective* ranks,
                      StepProbe* probe, bool with_digests);

}  // namespace retrace::train
