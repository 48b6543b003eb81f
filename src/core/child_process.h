// Runs a function in a fresh child process (fork) and brings its trivially copyable result back
// through a pipe. Measurements use it so that one run's allocations (peak RSS) cannot hide
// another's. A child that throws prints what it threw to stderr and yields nullopt.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <type_traits>

#include "core/error.h"

namespace retrace {

template <typename T, typename Fn>
std::optional<T> run_in_child(Fn&& fn) {
  static_assert(std::is_trivially_copyable_v<T>, "the result crosses a pipe as bytes");
  int fds[2];
  RETRACE_CHECK(::pipe(fds) == 0, IoError, "pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  RETRACE_CHECK(pid >= 0, IoError, "fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    int rc = 1;
    try {
      T result = fn();
      rc = ::write(fds[1], &result, sizeof result) == static_cast<ssize_t>(sizeof result) ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    ::_exit(rc);
  }
  ::close(fds[1]);
  T result{};
  const ssize_t n = ::read(fds[0], &result, sizeof result);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (n != static_cast<ssize_t>(sizeof result) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return result;
}

// Peak resident set size of this process so far, in MiB (ru_maxrss is in KiB on Linux).
inline double peak_rss_mib() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace retrace
