// The layout of a run directory, in one place: every part that reads or writes a file of a run asks
// here for its path (record, resume, replay, golden, the CLI).
//
//   RUN/config.toml                 the resolved config, as used
//   RUN/trace.rtrace                the step trace
//   RUN/trace.set-aside.rtrace      frames a dead run wrote after its last checkpoint (on resume)
//   RUN/checkpoints/step-N/         manifest + one shard per rank; RUN/checkpoints/LATEST
//   RUN/faults.fired                once-only faults that already fired (crash@N), one per line
//   RUN/replay/                     the scratch run `retrace replay RUN` re-executes into
//
// A golden run (golden/NAME/) holds the same config.toml and trace.rtrace.
#pragma once

#include <string>

namespace retrace::run {

std::string config_path(const std::string& run_dir);
std::string trace_path(const std::string& run_dir);
std::string set_aside_path(const std::string& run_dir);
std::string checkpoint_root(const std::string& run_dir);
std::string fired_path(const std::string& run_dir);
std::string replay_dir(const std::string& run_dir);

// run_or_trace names a run directory or a trace file inside one: the trace file's path.
std::string trace_of(const std::string& run_or_trace);

}  // namespace retrace::run
