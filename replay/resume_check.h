// Resume verification: run the same config uninterrupted and interrupted-then-resumed, and
// compare the two traces step by step. Between equal numerics fingerprints (always, when one
// process or one launch makes both) the verdict is RESUME VERIFIED only for equal bits in every
// field and digest of every step: anything else is a bug. Only when the two traces' numerics
// fields differ is a loss tolerance (1e-4) the criterion, and the verdict says so.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "replay/compare.h"
#include "train/config.h"
#include "train/registry.h"
#include "run/run.h"

namespace retrace::replay {

struct ResumeCheck {
  std::string uninterrupted_dir;
  std::string resumed_dir;
  CompareReport bitwise;  // every field
  // The first difference in the evaluations and the training events (bitwise between equal
  // numerics; steps and kinds only across numerics).
  std::optional<std::string> evals_diff, events_diff;
  bool verified = false;  // see above
  double tolerance = 1e-4;
  std::vector<std::string> numerics_diffs;  // numerics fields that differ (empty: bitwise verdict)
  // The resumed run continued on another world size (`resume --reshard`, its "resharded from"
  // event). Under runtime.invariance = "batch" (`invariant`) the steps are compared with
  // CompareMode::kLayout, every layout-free field and digest bitwise; without it, losses within
  // the tolerance.
  bool resharded = false;
  bool invariant = false;
};

// The verdict on two finished traces: the uninterrupted run's and the resumed run's.
ResumeCheck resume_verdict(const std::string& uninterrupted_trace, const std::string& resumed_trace);

// Runs into out_dir/uninterrupted and out_dir/resumed (both replaced if present).
ResumeCheck check_resume(const train::Config& config, const std::string& out_dir, uint64_t interrupt_at,
                         const run::RunCallbacks& callbacks, bool force = false,
                         const train::Registry& registry = train::builtin_registry());

}  // namespace retrace::replay
