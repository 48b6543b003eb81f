#include "run/layout.h"

#include <filesystem>

#include "trace/framing.h"

namespace retrace::run {
namespace {
std::string in(const std::string& dir, const char* name) { return (std::filesystem::path(dir) / name).string(); }
}  // namespace

std::string config_path(const std::string& run_dir) { return in(run_dir, "config.toml"); }
std::string trace_path(const std::string& run_dir) { return in(run_dir, "trace.rtrace"); }
std::string set_aside_path(const std::string& run_dir) {
  return in(run_dir, (std::string("trace") + trace::kSetAsideSuffix).c_str());
}
std::string checkpoint_root(const std::string& run_dir) { return in(run_dir, "checkpoints"); }
std::string fired_path(const std::string& run_dir) { return in(run_dir, "faults.fired"); }
std::string replay_dir(const std::string& run_dir) { return in(run_dir, "replay"); }

std::string trace_of(const std::string& run_or_trace) {
  std::error_code ec;
  return std::filesystem::is_directory(run_or_trace, ec) ? trace_path(run_or_trace) : run_or_trace;
}

}  // namespace retrace::run
