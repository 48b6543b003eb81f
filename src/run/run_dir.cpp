#include "run/run_dir.h"

#include <fcntl.h>
#include <stdio.h>
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

// Everything in `dir` but its lock file (which the caller holds).
void clear_dir(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec))
    if (entry.path().filename() != kLockFile) stdfs::remove_all(entry.path(), ec);
  RETRACE_CHECK(!ec, IoError, "cannot clear directory ", dir, ": ", ec.message());
}

// Empty but for a lock file (a run killed before it wrote anything else leaves one).
bool empty_but_lock(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec))
    if (entry.path().filename() != kLockFile) return false;
  return !ec;
}

}  // namespace

bool is_scratch_dir(const std::string& dir) {
  std::error_code ec;
  return stdfs::symlink_status(stdfs::path(dir) / kScratchMarker, ec).type() == stdfs::file_type::regular;
}

RunLock claim_scratch_dir(const std::string& dir, bool force, const std::string& what) {
  std::error_code ec;
  const auto type = stdfs::symlink_status(dir, ec).type();
  RETRACE_CHECK(type == stdfs::file_type::not_found || type == stdfs::file_type::directory, ConfigError, dir,
                " exists and is not a directory; choose another directory for the scratch run");
  fs::make_writable_dir(dir);
  RunLock lock = RunLock::acquire(dir, what);
  if (!empty_but_lock(dir)) {
    RETRACE_CHECK(force || is_scratch_dir(dir), ConfigError, dir,
                  " exists and is not a scratch directory that retrace made (it has no ", kScratchMarker,
                  "); nothing in it was touched. Pass --force to replace it, or choose another directory");
    clear_dir(dir);
  }
  fs::write_file_atomic((stdfs::path(dir) / kScratchMarker).string(), scratch_marker_text());
  return lock;
}

void remove_scratch_dir(const std::string& dir) {
  if (!is_scratch_dir(dir)) return;
  std::error_code ec;
  stdfs::remove_all(dir, ec);
}

RunLock create_run_dir(const std::string& dir, bool force, bool scratch, const std::string& config_text,
                       const std::string& what) {
  std::error_code ec;
  stdfs::path target = stdfs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "run/" names "run"
  stdfs::path parent = stdfs::absolute(target).parent_path();
  RETRACE_CHECK(stdfs::exists(parent, ec), IoError, "cannot create run directory ", dir, ": parent directory ",
                parent.string(), " does not exist");
  if (scratch) {
    RunLock lock = claim_scratch_dir(dir, force, what);  // locked, marked, and empty but for both
    fs::write_file_atomic(config_path(dir), config_text);
    return lock;
  }
  // Twice at most: a directory that appears between the look and the rename is then locked first.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (stdfs::symlink_status(target, ec).type() != stdfs::file_type::not_found) {
      RETRACE_CHECK(stdfs::is_directory(target, ec), IoError, "cannot create run directory ", dir,
                    ": it exists and is not a directory; choose another --out");
      RunLock lock = RunLock::acquire(target.string(), what);
      if (!empty_but_lock(target.string())) {
        RETRACE_CHECK(force, ConfigError, "run directory ", dir,
                      " already exists; pass --force to replace it, `retrace resume ", dir,
                      "` to continue it, or choose another --out");
        clear_dir(target.string());
      }
      fs::write_file_atomic(config_path(target.string()), config_text);
      return lock;
    }
    const std::string staging = target.string() + ".tmp-" + std::to_string(::getpid());
    stdfs::remove_all(staging, ec);
    fs::make_writable_dir(staging);
    RunLock lock = RunLock::acquire(staging, what);
    fs::write_file_atomic(config_path(staging), config_text);
    // A file system without RENAME_NOREPLACE (EINVAL: some network file systems) gets a plain
    // rename, which still never replaces a directory that holds anything (ENOTEMPTY).
    int rc = ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && errno == EINVAL && !stdfs::exists(target, ec)) rc = ::rename(staging.c_str(), target.c_str());
    if (rc == 0) {
      lock.moved_to(target.string());
      fs::fsync_dir(parent.string());
      return lock;
    }
    const int err = errno;
    lock.release();
    stdfs::remove_all(staging, ec);
    RETRACE_CHECK(err == EEXIST || err == ENOTEMPTY, IoError, "cannot move ", staging, " to ", dir, ": ",
                  fs::errno_text(err));
  }
  RETRACE_FAIL(IoError, "cannot create run directory ", dir,
               ": another process creates and removes it at the same "
               "time; is another job writing there?");
}

}  // namespace retrace::run
