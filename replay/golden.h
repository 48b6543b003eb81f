// Golden traces: small recorded runs kept in the repository (golden/NAME/) and re-run by CI.
//
//   golden/NAME/config.toml   the resolved config that made the trace (used as is by check)
//   golden/NAME/golden.toml   how to run it (interrupt_at for a resumed run) and the history of
//                             updates, each with its date and reason
//   golden/NAME/trace.rtrace  the golden trace
//
// check: re-run NAME into a scratch directory and compare step by step with the golden trace:
// bitwise when the environment fingerprints match (keys "info.*" aside), else loss tolerance 1e-4
// (the report says which fields differ). update: regenerate and append the reason to the history.
#pragma once

#include <string>
#include <vector>

#include "replay/compare.h"
#include "train/run.h"

namespace retrace::replay {

struct GoldenResult {
  std::string name;
  bool passed = false;
  CompareMode mode = CompareMode::kBitwise;
  std::vector<std::string> fingerprint_diffs;
  CompareReport report;
  std::string scratch_dir;
};

std::vector<std::string> list_goldens(const std::string& golden_dir);
// `overrides` and `inject` change the re-run (to show that a changed run fails the check).
GoldenResult check_golden(const std::string& golden_dir, const std::string& name,
                          const std::vector<std::string>& overrides, const std::string& scratch_root,
                          const train::RunCallbacks& callbacks);
// Regenerates NAME (creating it from the built-in config plus `overrides` when it does not exist)
// and records `reason`. ConfigError when reason is empty.
void update_golden(const std::string& golden_dir, const std::string& name, const std::string& reason,
                   const std::vector<std::string>& overrides, int64_t interrupt_at,
                   const train::RunCallbacks& callbacks);

}  // namespace retrace::replay
