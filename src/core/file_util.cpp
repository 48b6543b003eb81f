#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/disk_wait.h"
#include "core/error.h"

namespace retrace::fs {

namespace {

struct DiskWaitState {
  DiskWaitHooks hooks;
  int depth = 0;
};
thread_local DiskWaitState disk_wait_state;

}  // namespace

void set_disk_wait_hooks(DiskWaitHooks hooks) {
  RETRACE_CHECK(disk_wait_state.depth == 0, InvariantError, "disk-wait hooks set during a disk wait");
  disk_wait_state.hooks = std::move(hooks);
}

// The hooks keep errno as they found it: the wait's own errno is what its caller reads.
DiskWait::DiskWait() {
  const int saved = errno;
  if (disk_wait_state.depth++ == 0 && disk_wait_state.hooks.begin) disk_wait_state.hooks.begin();
  errno = saved;
}

DiskWait::~DiskWait() {
  const int saved = errno;
  if (--disk_wait_state.depth == 0 && disk_wait_state.hooks.end) disk_wait_state.hooks.end();
  errno = saved;
}

int fsync_waiting(int fd) {
  const DiskWait waiting;
  return ::fsync(fd) == 0 ? 0 : errno;
}

std::string errno_text(int err) { return std::strerror(err); }

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  RETRACE_CHECK(fd >= 0, IoError, "cannot open directory ", dir, " to fsync it: ", errno_text(errno));
  const int err = fsync_waiting(fd);
  ::close(fd);
  RETRACE_CHECK(err == 0, IoError, "fsync of directory ", dir, " failed: ", errno_text(err));
}

void write_file_atomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RETRACE_CHECK(fd >= 0, IoError, "cannot create ", tmp, ": ", errno_text(errno),
                "; check that the directory exists and is writable");
  const size_t done = write_fully(fd, data.data(), data.size());
  if (done < data.size()) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    RETRACE_FAIL(IoError, "write to ", tmp, " failed after ", done, " of ", data.size(), " bytes: ", errno_text(err),
                 "; the previous ", path, " is untouched");
  }
  if (const int err = fsync_waiting(fd); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    RETRACE_FAIL(IoError, "fsync of ", tmp, " failed: ", errno_text(err));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    RETRACE_FAIL(IoError, "rename ", tmp, " -> ", path, " failed: ", errno_text(err));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_dir(dir.empty() ? "." : dir);
}

int open_regular_file(const std::string& path, Links links) {
  // O_NONBLOCK so that a FIFO or a device in place of the file cannot block the open; regular
  // files ignore the flag for reads.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (links == Links::kRefuse ? O_NOFOLLOW : 0));
  RETRACE_CHECK(fd >= 0 || errno != ELOOP || links != Links::kRefuse, FormatError, path,
                " is a symbolic link; a checkpoint's files are plain files in its directory and retrace does not "
                "follow links there (one could point at any file). Put the file itself in its place");
  RETRACE_CHECK(fd >= 0, IoError, "cannot open ", path, ": ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    RETRACE_FAIL(IoError, "cannot stat ", path, ": ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    RETRACE_FAIL(FormatError, path,
                 " is not a regular file (a FIFO, socket, device or directory is in its place); "
                 "retrace reads only regular files. Remove it or restore the file");
  }
  return fd;
}

int open_regular_file_within(const std::string& path, uint64_t max_bytes, uint64_t& size, Links links) {
  int fd = open_regular_file(path, links);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    RETRACE_FAIL(IoError, "cannot stat ", path, ": ", errno_text(err));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    RETRACE_FAIL(FormatError, path, " is ", st.st_size, " bytes, more than the limit of ", max_bytes,
                 " for this kind of file");
  }
  size = static_cast<uint64_t>(st.st_size);
  return fd;
}

size_t read_fully(int fd, char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

size_t write_fully(int fd, const char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

uint64_t read_at(int fd, uint64_t offset, void* out, uint64_t size, const std::string& path) {
  uint64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - done, uint64_t{1} << 30));
    ssize_t n = ::pread(fd, static_cast<char*>(out) + done, want, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    RETRACE_CHECK(n >= 0, IoError, "cannot read ", path, " at byte ", offset + done, ": ", errno_text(errno));
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  return done;
}

std::string read_file(const std::string& path, uint64_t max_bytes, Links links) {
  uint64_t size = 0;
  int fd = open_regular_file_within(path, max_bytes, size, links);
  std::string out(static_cast<size_t>(size), '\0');
  out.resize(read_fully(fd, out.data(), out.size()));
  ::close(fd);
  return out;
}

FileBytes read_file_bytes(const std::string& path, uint64_t max_bytes, Links links) {
  uint64_t size = 0;
  int fd = open_regular_file_within(path, max_bytes, size, links);
  FileBytes out(static_cast<size_t>(size));
  out.shrink_to(read_fully(fd, out.data(), out.size()));
  ::close(fd);
  return out;
}

void make_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RETRACE_CHECK(!ec, IoError, "cannot create directory ", dir, ": ", ec.message(),
                "; choose another --out or fix its permissions");
  RETRACE_CHECK(::access(dir.c_str(), W_OK) == 0, IoError, "directory ", dir, " is not writable: ", errno_text(errno),
                "; choose another --out or fix its permissions");
}

}  // namespace retrace::fs
