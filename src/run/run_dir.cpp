#include "run/run_dir.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "core/error.h"
#include "core/file_util.h"
#include "run/layout.h"

namespace retrace::run {
namespace {
namespace stdfs = std::filesystem;

std::string scratch_marker_text() {
  return "made by retrace for a re-executed run; retrace replaces this directory when it needs it again\n";
}

void clear_dir(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) stdfs::remove_all(entry.path(), ec);
  RETRACE_CHECK(!ec, IoError, "cannot clear directory ", dir, ": ", ec.message());
}

}  // namespace

bool is_scratch_dir(const std::string& dir) {
  std::error_code ec;
  return stdfs::symlink_status(stdfs::path(dir) / kScratchMarker, ec).type() == stdfs::file_type::regular;
}

void claim_scratch_dir(const std::string& dir, bool force) {
  std::error_code ec;
  const auto type = stdfs::symlink_status(dir, ec).type();
  if (type != stdfs::file_type::not_found) {
    RETRACE_CHECK(type == stdfs::file_type::directory, ConfigError, dir,
                  " exists and is not a directory; choose another directory for the scratch run");
    if (!stdfs::is_empty(dir, ec)) {
      RETRACE_CHECK(force || is_scratch_dir(dir), ConfigError, dir,
                    " exists and is not a scratch directory that retrace made (it has no ", kScratchMarker,
                    "); nothing in it was touched. Pass --force to replace it, or choose another directory");
      clear_dir(dir);
    }
  }
  fs::make_writable_dir(dir);
  fs::write_file_atomic((stdfs::path(dir) / kScratchMarker).string(), scratch_marker_text());
}

void remove_scratch_dir(const std::string& dir) {
  if (!is_scratch_dir(dir)) return;
  std::error_code ec;
  stdfs::remove_all(dir, ec);
}

void create_run_dir(const std::string& dir, bool force, bool scratch, const std::string& config_text) {
  std::error_code ec;
  stdfs::path target = stdfs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "run/" names "run"
  stdfs::path parent = stdfs::absolute(target).parent_path();
  RETRACE_CHECK(stdfs::exists(parent, ec), IoError, "cannot create run directory ", dir,
                ": parent directory ", parent.string(), " does not exist");
  if (scratch) {
    claim_scratch_dir(dir, force);  // marked, and empty but for the marker
  } else if (stdfs::exists(dir, ec)) {
    RETRACE_CHECK(stdfs::is_directory(dir, ec), IoError, "cannot create run directory ", dir,
                  ": it exists and is not a directory; choose another --out");
    if (!stdfs::is_empty(dir, ec)) {
      RETRACE_CHECK(force, ConfigError, "run directory ", dir,
                    " already exists; pass --force to replace it, `retrace resume ", dir,
                    "` to continue it, or choose another --out");
      clear_dir(dir);
    }
  }
  const std::string staging = target.string() + ".tmp-" + std::to_string(::getpid());
  stdfs::remove_all(staging, ec);
  fs::make_writable_dir(staging);
  if (scratch) fs::write_file_atomic((stdfs::path(staging) / kScratchMarker).string(), scratch_marker_text());
  fs::write_file_atomic(config_path(staging), config_text);
  if (stdfs::exists(target, ec)) stdfs::remove_all(target, ec);  // empty, or only the marker (checked above)
  RETRACE_CHECK(::rename(staging.c_str(), target.c_str()) == 0, IoError, "cannot move ", staging, " to ", dir, ": ",
                fs::errno_text(errno));
  fs::fsync_dir(parent.string());
}

}  // namespace retrace::run
