// Resume verification: run the same config uninterrupted and interrupted-then-resumed, and
// compare the two traces step by step. The verdict is RESUME VERIFIED when the largest loss
// difference is under the tolerance (1e-4); `bitwise` says whether every field, digests included,
// was equal (expected on CPU with equal environments).
#pragma once

#include <string>

#include "replay/compare.h"
#include "train/config.h"
#include "train/registry.h"
#include "run/run.h"

namespace retrace::replay {

struct ResumeCheck {
  std::string uninterrupted_dir;
  std::string resumed_dir;
  CompareReport bitwise;    // every field
  bool verified = false;    // max loss difference < tolerance and the same steps on both sides
  double tolerance = 1e-4;
};

// Runs into out_dir/uninterrupted and out_dir/resumed (both replaced if present).
ResumeCheck check_resume(const train::Config& config, const std::string& out_dir, uint64_t interrupt_at,
                         const run::RunCallbacks& callbacks, bool force = false,
                         const train::Registry& registry = train::builtin_registry());

}  // namespace retrace::replay
