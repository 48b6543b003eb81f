// Golden traces: small recorded runs kept in the repository (golden/NAME/) and re-run by CI.
//
//   golden/NAME/config.toml   the resolved config that made the trace (used as is by check)
//   golden/NAME/golden.toml   how to run it (interrupt_at for a resumed run) and the history of
//                             updates, each with its date and reason
//   golden/NAME/trace.rtrace  the golden trace
//
//
// check: re-run NAME into a scratch directory and compare step by step with the golden trace:
// bitwise when the numerics fields of the two fingerprints are equal (information fields such as
// the host never count), which under runtime.numerics = "portable" is every x86-64-v3 machine.
// When they differ (native numerics, another LibTorch, a kernel set in the environment) the
// check is kCrossNumericsRule, or golden.toml's [tolerance] table (abs, horizon, late_rel), and the
// report names the numerics fields that differ. update: regenerate and append the reason to the
// history.
#pragma once

#include <string>
#include <vector>

#include "replay/compare.h"
#include "run/run.h"

namespace retrace::replay {

// The rule across numerics (golden/README.md has the measurements behind it): the first 20 steps
// within 1e-4 (1e-3 for a golden under autocast), later steps within 2 % of the golden loss, and
// the numerics-free fields exact.
inline constexpr ToleranceRule kCrossNumericsRule{1e-4, 20, 0.02};
inline constexpr double kCrossNumericsAutocastAbs = 1e-3;

struct GoldenResult {
  std::string name;
  bool passed = false;
  CompareMode mode = CompareMode::kBitwise;
  ToleranceRule tolerance;
  std::vector<std::string> fingerprint_diffs;
  std::vector<records::KeyValue> numerics;  // the numerics fields of the new run
  CompareReport report;
  std::string scratch_dir;
};

std::vector<std::string> list_goldens(const std::string& golden_dir);
// `overrides` and `inject` change the re-run (to show that a changed run fails the check).
GoldenResult check_golden(const std::string& golden_dir, const std::string& name,
                          const std::vector<std::string>& overrides, const std::string& scratch_root,
                          const run::RunCallbacks& callbacks,
                          const train::Registry& registry = train::builtin_registry());
// Regenerates NAME (creating it from the built-in config plus `overrides` when it does not exist)
// and records `reason`. ConfigError when reason is empty.
void update_golden(const std::string& golden_dir, const std::string& name, const std::string& reason,
                   const std::vector<std::string>& overrides, int64_t interrupt_at, const run::RunCallbacks& callbacks,
                   const train::Registry& registry = train::builtin_registry());

}  // namespace retrace::replay
