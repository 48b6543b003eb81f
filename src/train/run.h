// The loop: `record` trains a fresh run into a run directory (DESIGN.md "File layout of a run"),
// writing the resolved config, the trace and checkpoints. The loop is thin: it calls the trainer,
// the trace writer and (later) the checkpointer, and reports progress through callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "trace/records.h"
#include "train/config.h"

namespace retrace::train {

struct RunCallbacks {
  std::function<void(const trace::StepRecord&, uint64_t total_steps)> on_step;
  std::function<void(const trace::EvalRecord&)> on_eval;
  std::function<void(const std::string&)> on_message;
};

struct RecordOptions {
  std::string out_dir = "run";
  bool force = false;  // replace an existing run directory
};

struct RunSummary {
  std::string run_dir;
  std::string trace_path;
  uint64_t steps = 0;
  uint64_t skipped = 0;
  double final_loss = 0;
  double test_accuracy = -1;  // -1 when no evaluation ran
  double wall_seconds = 0;
  double steps_per_second = 0;
  uint64_t trace_bytes = 0;
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0, trace_ms = 0;  // totals
};

// Trains `config` into options.out_dir. Validates everything (config, data set, output
// directory) before creating anything, so a failure never leaves a half-written run. An existing
// non-empty directory is refused (ConfigError) unless options.force.
RunSummary record(Config config, const RecordOptions& options, const RunCallbacks& callbacks);

}  // namespace retrace::train
