#include "trace/fd_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "core/file_util.h"

namespace retrace::trace {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

size_t pread_full(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  size_t done = 0;
  auto* p = static_cast<char*>(buf);
  while (done < n) {
    ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    RETRACE_CHECK(got >= 0, IoError, "cannot read ", path, " at offset ", offset + done, ": ", fs::errno_text(errno));
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void write_full(int fd, const void* buf, size_t n, const std::string& path) {
  size_t done = 0;
  auto* p = static_cast<const char*>(buf);
  while (done < n) {
    ssize_t put = ::write(fd, p + done, n - done);
    if (put < 0 && errno == EINTR) continue;
    RETRACE_CHECK(put >= 0, IoError, "cannot write ", n - done, " bytes to ", path, ": ", fs::errno_text(errno),
                  "; check free disk space and permissions");
    done += static_cast<size_t>(put);
  }
}

uint64_t file_size(int fd, const std::string& path) {
  struct stat st;
  RETRACE_CHECK(::fstat(fd, &st) == 0, IoError, "cannot stat ", path, ": ", fs::errno_text(errno));
  return static_cast<uint64_t>(st.st_size);
}

void fsync_fd(int fd, const std::string& path) {
  RETRACE_CHECK(::fsync(fd) == 0, IoError, "cannot fsync ", path, ": ", fs::errno_text(errno));
}

}  // namespace retrace::trace
