#include "run/run_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/file_util.h"

namespace retrace::run {
namespace {

std::string lock_path(const std::string& dir) { return (std::filesystem::path(dir) / kLockFile).string(); }

bool locks_off() {
  const char* v = std::getenv("RETRACE_RUN_LOCK");
  return v && std::string(v) == "off";
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string description(const std::string& what) {
  char when[32] = {};
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "pid " + std::to_string(::getpid()) + " on host " + host_name() + ": retrace " + what + " since " + when;
}

// What the holder wrote into the lock file (its first line, at most 300 bytes).
std::string read_holder(int fd) {
  char buf[301] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return s.empty() ? "a process that has not yet said who it is" : s;
}

flock whole_file(short type) {
  flock fl{};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;  // the whole file
  fl.l_pid = 0;  // required for OFD locks
  return fl;
}

}  // namespace

RunLock::RunLock(RunLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

RunLock::~RunLock() { release(); }

void RunLock::release() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the close: a process waiting on this file re-checks and retries
  ::close(fd_);
  fd_ = -1;
}

void RunLock::moved_to(const std::string& dir) {
  if (fd_ >= 0) path_ = lock_path(dir);
}

RunLock RunLock::acquire(const std::string& dir, const std::string& what) {
  if (locks_off()) {
    std::fprintf(stderr,
                 "retrace: warning: RETRACE_RUN_LOCK=off: %s is written without its lock; make sure no "
                 "other process writes it\n",
                 dir.c_str());
    return RunLock{};
  }
  const std::string path = lock_path(dir);
  // A holder that releases unlinks the file after we opened it: the re-check below sees another
  // file (or none) at the path and tries again; only a path that keeps changing gives up.
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    RETRACE_CHECK(fd >= 0, IoError, "cannot open the lock file ", path, " of run directory ", dir, ": ",
                  fs::errno_text(errno), errno == ELOOP ? " (it is a symbolic link; remove it)" : "",
                  "; the directory must be writable by the process that writes the run");
    flock fl = whole_file(F_WRLCK);
    if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
      const int err = errno;
      if (err == EAGAIN || err == EACCES) {
        ::close(fd);
        refuse_if_held(dir, what);  // names the holder
        continue;                   // released in between: try again
      }
      ::close(fd);
      RETRACE_FAIL(IoError, "cannot lock run directory ", dir, " (", path, "): ", fs::errno_text(err),
                   "; its file system does not support the file locks that keep a run to one writer. Use a local or "
                   "NFS directory, or set RETRACE_RUN_LOCK=off if you are sure that no other process writes this run");
    }
    struct stat mine {
    }, now{};
    if (::fstat(fd, &mine) != 0 || ::stat(path.c_str(), &now) != 0 || mine.st_ino != now.st_ino ||
        mine.st_dev != now.st_dev) {
      ::close(fd);  // released (unlinked) or replaced between our open and our lock
      continue;
    }
    RunLock lock;
    lock.fd_ = fd;
    lock.path_ = path;
    const std::string text = description(what) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      const int err = errno;
      RETRACE_FAIL(IoError, "cannot write the lock file ", path, ": ", fs::errno_text(err));
    }
    return lock;
  }
  RETRACE_FAIL(IoError, "cannot lock run directory ", dir, ": its lock file ", path,
               " was replaced 16 times while retrace tried to take it; is something removing it?");
}

void RunLock::refuse_if_held(const std::string& dir, const std::string& what) {
  if (locks_off()) return;
  if (const auto who = holder(dir))
    RETRACE_FAIL(IoError, "run directory ", dir, " is being written by another process (", *who,
                 "); a run has one writer at a time, and this `retrace ", what,
                 "` did not touch it. Wait for that "
                 "process to end (or stop it), then run this again; or write another directory");
}

std::optional<std::string> RunLock::holder(const std::string& dir) {
  const std::string path = lock_path(dir);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  flock fl = whole_file(F_WRLCK);
  std::optional<std::string> out;
  if (::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) out = read_holder(fd);
  ::close(fd);
  return out;
}

}  // namespace retrace::run
