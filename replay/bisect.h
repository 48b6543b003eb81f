// Bisection: where two runs part ways, in levels.
//   step    the first step whose hash-chain digest differs: a binary search over the traces'
//           indexes (agreement of the chain at step N means agreement on the whole prefix)
//   rank    under data parallelism, the first rank whose local gradient digest differs
//   module  both runs re-execute that step from their nearest checkpoint before it (or from the
//           start), digesting every parameter at the step start, every module's forward output,
//           every gradient and every updated parameter; the first entry that differs names the
//           module and the phase (state, forward, backward, optimizer)
//   op      within that module and phase, per-operator output digests from LibTorch's
//           RecordFunction callbacks name the first operator whose output differs
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "run/run.h"
#include "train/numerics.h"

namespace retrace::replay {

struct BisectReport {
  bool diverged = false;
  uint64_t common_steps = 0;   // steps present in both traces
  uint32_t search_probes = 0;  // chain comparisons made by the binary search
  uint64_t step = 0;
  std::optional<uint32_t> rank;
  std::string module, module_type, phase, what, op;
  std::string detail;                               // e.g. max abs difference and where
  uint64_t replay_start_a = 0, replay_start_b = 0;  // checkpoint steps the re-execution started from
  std::vector<std::string> notes;                   // config and fingerprint differences, caveats
  std::string summary() const;  // "first divergence: step 57, rank 0, module layers.0 (Linear), ..."
};

// `a` and `b` are run directories (or their traces; the checkpoints must sit beside the trace).
// ConfigError when the traces are of different models (use diff for those).
// Under data parallelism both runs re-execute on their recorded world size, one process per rank,
// by running this program's hidden command `probe-step` (the retrace CLI's, also in a user's binary
// that calls retrace::run_cli); the rank named is the first whose local gradient digest, RNG
// digest or re-execution differs.
BisectReport bisect_runs(const std::string& a, const std::string& b, const run::RunCallbacks& callbacks,
                         const train::Registry& registry = train::builtin_registry());

// `retrace probe-step`: this rank's re-execution of `step` of the run `run` (from its newest
// checkpoint before it), written as JSON to PREFIX.rankN.json for bisect_runs.
void write_probe_of_rank(const std::string& run, uint64_t step, train::Numerics numerics,
                         const train::Registry& registry, distributed::ProcessGroup* process_group,
                         const std::string& prefix);

}  // namespace retrace::replay
