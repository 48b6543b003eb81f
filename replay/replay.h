// Replay: rebuild a run from its trace header (resolved config, seeds, injected faults) and,
// when asked, one of its checkpoints; re-execute; compare every step record with the recorded one.
// Bitwise when the environment fingerprints are equal (keys "info.*" aside), otherwise a loss
// tolerance (1e-4 by default) with a note naming the fingerprint fields that differ.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "replay/compare.h"
#include "records/records.h"
#include "run/run.h"

namespace retrace::replay {

struct ReplayOptions {
  std::optional<uint64_t> from_checkpoint;  // step of a checkpoint in the run's checkpoints/
  uint64_t first = 0;                       // compare steps in [first, last]
  uint64_t last = UINT64_MAX;
  std::optional<double> tolerance;            // forces tolerance mode
  bool bitwise = false;                       // forces bitwise mode
  std::string scratch_dir;                    // where the replay runs; default RUN/replay
  bool force = false;                         // replace scratch_dir even if retrace did not make it
  const train::Registry* registry = nullptr;  // what the run's config may name; nullptr: the built-ins
  bool accept_changed_inputs = false;         // replay although an input's sha256 is not the header's
  bool accept_other_torch = false;            // replay with another LibTorch than the header's (tolerance)
};

struct ReplayResult {
  std::string recorded_trace;
  std::string replay_dir;
  CompareMode mode = CompareMode::kBitwise;
  double tolerance = 1e-4;
  std::vector<std::string> fingerprint_diffs;  // empty when equal
  CompareReport report;
  std::optional<records::StepRecord> recorded_at_diff;  // context of the first difference
  std::optional<records::StepRecord> replayed_at_diff;
  std::vector<std::string> input_changes;  // accepted with accept_changed_inputs (else an error)
  // What the run directory says otherwise than the trace header (RUN/config.toml edited, rewritten
  // by a reshard, or missing): the replay re-executes the header's config, the run as recorded.
  std::vector<std::string> config_warnings;
  // The first difference in the evaluations and in the training events of the compared steps.
  std::optional<std::string> evals_diff, events_diff;
  bool verified() const {
    return report.compared > 0 && !report.first_diff && report.only_in_a == 0 && !evals_diff && !events_diff;
  }
};

// `run_or_trace` is a run directory or its trace.rtrace. IoError / FormatError for missing or
// unreadable inputs; a divergence is a value in the result.
ReplayResult replay_run(const std::string& run_or_trace, const ReplayOptions& options,
                        const run::RunCallbacks& callbacks);

}  // namespace retrace::replay
