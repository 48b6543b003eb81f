// `retrace memory`: the training-memory plan of a GPT config under each activation-checkpoint
// policy, from the estimator (model/memory_plan.h) and measured on a real step.
//
// Measurement: each policy runs in a fresh child process (fork), so one policy's allocations cannot
// hide another's: the child applies the run's thread layout, builds the model and one batch, runs a
// warm-up step and `steps` timed steps (forward + backward), and reports the growth of its peak RSS
// over the timed steps and the median step time. Rounds interleave the policies; the report takes
// medians. glibc malloc keeps freed memory mapped and hides part of the saving; tcmalloc (linked
// into the retrace binary when present) shows it (measured on a char GPT with full checkpointing:
// peak RSS 444 to 332 MiB with tcmalloc, no visible drop with glibc).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/memory_plan.h"
#include "train/config.h"

namespace retrace::run {

struct PolicyMeasurement {
  std::string name;  // "none", "full k=4", "sqrt", "selective"
  std::string policy;
  int64_t k = 4;
  model::MemoryEstimate estimate;
  double step_ms = 0;         // median over rounds
  double rss_growth_mib = 0;  // median over rounds
  double peak_rss_mib = 0;
  bool measured = false;
};

// The memory this process can still allocate: /proc/meminfo's MemAvailable, or less where a
// cgroup v2 limit (memory.max - memory.current) is lower. 0 when neither can be read.
uint64_t available_memory_bytes();

// Whole copies of the training state a run of `config` keeps beside it: the spike guard's rollback
// anchor (guards.spike_factor with checkpoint.every_steps) and a background save's staging buffer
// (checkpoint.async where it applies, with a cadence).
int64_t state_copies_kept(const train::Config& config);

// The memory plan of config's GPT for vocabulary `vocab` (model/memory_plan.h's estimate_lm_memory)
// under checkpoint `policy` with segment length k, ZeRO-1 figures for `world_size`; the
// parameters are counted from the shape; it counts state_copies_kept(config).
model::MemoryEstimate gpt_memory_estimate(const train::Config& config, int64_t vocab, const std::string& policy,
                                          int64_t k, int64_t world_size);

// Before a GPT run allocates its model: when its training step (the plan's total) or its
// evaluation batch would need more than available_memory_bytes(), a ConfigError that names what
// it needs and the setting to lower (data.batch_size, eval.batch_size, data.context, the model's
// shape). Other model kinds are not estimated.
void check_memory_fits(const train::Config& config, int64_t vocab);

// Estimates (and, when rounds > 0, measures) every policy for config's GPT shape.
// `progress` (when set) hears of each measurement as it finishes: done of total child processes.
std::vector<PolicyMeasurement> plan_memory(const train::Config& config, int64_t world_size, int rounds, int steps,
                                           const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace retrace::run
