// The accumulation grid (`retrace record --accum-grid 1,2,4,8,16`): the same effective batch
// (data.batch_size x train.accum_steps of the config) trained with each number of micro-batches,
// each in a fresh child process (so its peak memory is its own), then compared with the first
// setting step by step. Expected: equal curves within float rounding, time growing with the
// number of micro-batches (accumulation saves memory, not time); under runtime.invariance =
// "batch", equal bits (losses, parameters, optimizer state, RNG), dropout included.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"
#include "train/registry.h"

namespace retrace::replay {

struct AccumGridRow {
  int64_t accum_steps = 0;
  int64_t micro_batch = 0;
  double final_loss = 0;
  double max_loss_diff = 0;  // against the first setting, over every step
  uint64_t compared = 0;
  // runtime.invariance = "batch": whether every layout-free field and digest of every step equals
  // the first setting's (CompareMode::kLayout); the first difference otherwise.
  bool bitwise = false;
  std::string first_diff;
  double median_step_ms = 0;  // wall time per effective step (sum of the traced phases)
  double peak_rss_mib = 0;    // of the child process that trained it
  std::string run_dir;
};

std::vector<AccumGridRow> accum_grid(const train::Config& config, const std::vector<int64_t>& grid,
                                     const std::string& out_dir,
                                     const train::Registry& registry = train::builtin_registry());

}  // namespace retrace::replay
