// Runs a function in a fresh child process (fork) and brings its trivially copyable result back
// through a pipe. Measurements use it so that one run's allocations (peak RSS) cannot hide
// another's. What the child throws comes back as the same kind of error, prefixed with `what`:
// a retrace::Error keeps its kind (a config error stays exit 2, a damaged file exit 3, ...), running
// out of memory is an IoError (exit 4), and so is a child killed by a signal (the kernel's
// out-of-memory killer sends SIGKILL); anything else is an InvariantError (a bug).
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/file_util.h"

namespace retrace {

namespace child_detail {
// What crosses the pipe after the result's bytes: a tag, then for an error its message.
enum Tag : char { kResult = 0, kConfig = 1, kFormat = 2, kIntegrity = 3, kIo = 4, kOutOfMemory = 5, kOther = 6 };
inline Tag tag_of(const Error& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return kConfig;
  if (dynamic_cast<const FormatError*>(&e)) return kFormat;
  if (dynamic_cast<const IntegrityError*>(&e)) return kIntegrity;
  if (dynamic_cast<const IoError*>(&e)) return kIo;
  return kOther;
}
[[noreturn]] inline void rethrow(Tag tag, const std::string& message) {
  switch (tag) {
    case kConfig: throw ConfigError(message);
    case kFormat: throw FormatError(message);
    case kIntegrity: throw IntegrityError(message);
    case kIo: throw IoError(message);
    case kOutOfMemory: throw IoError(message + "out of memory; use a smaller configuration or a machine with more");
    default: throw InvariantError(message);
  }
}
}  // namespace child_detail

template <typename T, typename Fn>
T run_in_child(Fn&& fn, const std::string& what) {
  static_assert(std::is_trivially_copyable_v<T>, "the result crosses a pipe as bytes");
  using namespace child_detail;
  int fds[2];
  RETRACE_CHECK(::pipe(fds) == 0, IoError, "pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  RETRACE_CHECK(pid >= 0, IoError, "fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    std::string out(1, kResult);
    try {
      T result = fn();
      out.append(reinterpret_cast<const char*>(&result), sizeof result);
    } catch (const Error& e) {
      out.assign(1, tag_of(e));
      out += e.what();
    } catch (const std::bad_alloc&) {
      out.assign(1, kOutOfMemory);
    } catch (const std::exception& e) {
      out.assign(1, kOther);
      out += e.what();
    }
    (void)fs::write_fully(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    RETRACE_FAIL(IoError, what, ": its child process was killed by signal ", WTERMSIG(status),
                 WTERMSIG(status) == SIGKILL ? " (SIGKILL: the kernel's out-of-memory killer sends it when memory runs "
                                               "out; use a smaller configuration or a machine with more)"
                                             : "");
  if (!got.empty() && got[0] == kResult && got.size() == 1 + sizeof(T)) {
    T result;
    std::memcpy(&result, got.data() + 1, sizeof result);
    return result;
  }
  if (!got.empty() && got[0] != kResult) rethrow(static_cast<Tag>(got[0]), what + ": " + got.substr(1));
  RETRACE_FAIL(InvariantError, what, ": its child process ended without a result (exit status ",
               WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")");
}

// Peak resident set size of this process so far, in MiB (ru_maxrss is in KiB on Linux).
inline double peak_rss_mib() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace retrace
