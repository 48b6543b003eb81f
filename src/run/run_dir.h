// Making run directories and scratch directories (layout.h has what goes inside).
//
// Both take the run directory's lock (run_lock.h) before they change anything in it, and hand it
// to the caller, who holds it while the run is written: a second writer is refused (IoError,
// exit 4) before it clears, replaces or writes a file.
//
// A new run directory never exists without its config: create_run_dir makes it, config.toml and
// the lock included, in a staging sibling "DIR.tmp-PID" that is renamed into place only when
// nothing is there (renameat2 RENAME_NOREPLACE; a run killed in its first second leaves only the
// staging directory behind, which nothing mistakes for a run). An existing directory (empty, or
// replaced with `force`) is locked first, then cleared, then given config.toml atomically: killed
// in between, it holds no config.toml, which resume reports as a run that never started.
//
// Scratch directories are where retrace re-executes runs (RUN/replay, golden check's scratch, the
// runs of --verify-resume and --accum-grid). No command removes a directory it did not make: a
// scratch directory holds kScratchMarker, and only such a directory (or an empty one, or any with
// `force`) is cleared for reuse. ConfigError otherwise, with nothing touched.
#pragma once

#include <string>

#include "run/run_lock.h"

namespace retrace::run {

inline constexpr const char* kScratchMarker = ".retrace-scratch";

// Creates `dir` holding config.toml = config_text. An existing non-empty directory is refused
// (ConfigError) unless `force`; with `scratch`, it is claimed as a scratch directory instead.
// IoError when the parent does not exist or cannot be written, or another process writes `dir`.
// `what` names the command in the lock ("record"). Returns the directory's lock.
RunLock create_run_dir(const std::string& dir, bool force, bool scratch, const std::string& config_text,
                       const std::string& what = "record");

bool is_scratch_dir(const std::string& dir);
// Makes `dir` (when missing), locks it, clears it (only a scratch directory, an empty one or any
// with `force`; ConfigError otherwise, nothing touched) and marks it as a scratch directory.
RunLock claim_scratch_dir(const std::string& dir, bool force, const std::string& what = "scratch run");
// Removes `dir` if it is a scratch directory; leaves anything else alone.
void remove_scratch_dir(const std::string& dir);

}  // namespace retrace::run
