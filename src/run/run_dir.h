// Making run directories and scratch directories (layout.h has what goes inside).
//
// A run directory never exists without its config: create_run_dir makes it, config.toml included,
// in a staging sibling "DIR.tmp-PID" that is renamed into place (a run killed in its first second
// leaves only the staging directory behind, which nothing mistakes for a run).
//
// Scratch directories are where retrace re-executes runs (RUN/replay, golden check's scratch, the
// runs of --verify-resume and --accum-grid). No command removes a directory it did not make: a
// scratch directory holds kScratchMarker, and only such a directory (or an empty one, or any with
// `force`) is cleared for reuse. ConfigError otherwise, with nothing touched.
#pragma once

#include <string>

namespace retrace::run {

inline constexpr const char* kScratchMarker = ".retrace-scratch";

// Creates `dir` holding config.toml = config_text. An existing non-empty directory is refused
// (ConfigError) unless `force`; with `scratch`, it is claimed as a scratch directory instead.
// IoError when the parent does not exist or cannot be written.
void create_run_dir(const std::string& dir, bool force, bool scratch, const std::string& config_text);

bool is_scratch_dir(const std::string& dir);
void claim_scratch_dir(const std::string& dir, bool force);
// Removes `dir` if it is a scratch directory; leaves anything else alone.
void remove_scratch_dir(const std::string& dir);

}  // namespace retrace::run
