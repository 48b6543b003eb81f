#include "distributed/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "core/error.h"
#include "train/launch.h"

namespace retrace::distributed {
namespace {

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  RETRACE_CHECK(fd >= 0, IoError, "cannot open a socket to find a free port: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  RETRACE_CHECK(ok, IoError, "cannot bind a loopback port for the ranks' rendezvous: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string partial;
  bool done = false;
  int status = 0;
};

void forward(Child& c, uint32_t rank, bool flush_all) {
  size_t pos;
  while ((pos = c.partial.find('\n')) != std::string::npos) {
    std::printf("[rank %u] %s\n", rank, c.partial.substr(0, pos).c_str());
    c.partial.erase(0, pos + 1);
  }
  if (flush_all && !c.partial.empty()) {
    std::printf("[rank %u] %s\n", rank, c.partial.c_str());
    c.partial.clear();
  }
  std::fflush(stdout);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 4;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}
}  // namespace

namespace {

// In the forked child of rank r: the rank's environment, its output into the pipe, and the exec
// of this binary with `args`; it does not return.
[[noreturn]] void exec_rank(uint32_t r, uint32_t world_size, uint16_t port, int fds[2],
                            const std::vector<std::string>& args) {
  ::close(fds[0]);
  ::dup2(fds[1], STDOUT_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[1]);
  ::setenv("RANK", std::to_string(r).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
  ::setenv("RETRACE_LAUNCHER", "local", 1);
  // The ranks share this host's cores: the OpenBLAS worker spin the retrace launcher chose for
  // one process may not suit them (train/launch.h).
  train::fit_thread_timeout(train::blas_in_process(), world_size);
  // This launcher's rank 0 serves the store itself, even when it runs under another launcher.
  for (const char* var : {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID"})
    ::unsetenv(var);
  std::vector<char*> argv;
  std::string self = "retrace";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "cannot start rank %u: %s\n", r, std::strerror(errno));
  ::_exit(4);
}

// One look at the ranks' pipes (200 ms at most): what they wrote is forwarded line by line, and a
// pipe at its end is closed.
void forward_output(std::vector<Child>& children) {
  const uint32_t world_size = static_cast<uint32_t>(children.size());
  std::vector<pollfd> pfds;
  std::vector<uint32_t> who;
  for (uint32_t r = 0; r < world_size; ++r)
    if (children[r].fd >= 0) {
      pfds.push_back({children[r].fd, POLLIN, 0});
      who.push_back(r);
    }
  if (!pfds.empty()) ::poll(pfds.data(), pfds.size(), 200);
  else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (size_t i = 0; i < pfds.size(); ++i) {
    if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Child& c = children[who[i]];
    char buf[8192];
    ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n > 0) {
      c.partial.append(buf, static_cast<size_t>(n));
      forward(c, who[i], false);
    } else {
      forward(c, who[i], true);
      ::close(c.fd);
      c.fd = -1;
    }
  }
}

// Reaps the ranks that ended since the last look (`alive` counts down) and returns the failed one
// to report, if any. When several failed, the one reported is the one whose failure is its own: a
// rank that exits on a config error or bad input closes its sockets, and a rank still joining then
// fails with an environment error (exit 4) that is only the echo of it; within one look, the order
// of the ranks says nothing of which came first.
std::optional<uint32_t> reap_ranks(std::vector<Child>& children, uint32_t& alive) {
  const uint32_t world_size = static_cast<uint32_t>(children.size());
  std::optional<uint32_t> failed_rank;
  for (uint32_t r = 0; r < world_size; ++r) {
    Child& c = children[r];
    if (c.done) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.done = true;
    c.status = status;
    --alive;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    const bool own = WIFEXITED(status) && WEXITSTATUS(status) != 4;
    if (!failed_rank ||
        (own && !(WIFEXITED(children[*failed_rank].status) && WEXITSTATUS(children[*failed_rank].status) != 4)))
      failed_rank = r;
  }
  return failed_rank;
}

}  // namespace

int launch_local(uint32_t world_size, const std::vector<std::string>& args) {
  RETRACE_CHECK(world_size >= 1, ConfigError, "--world-size must be at least 1");
  const uint16_t port = free_port();
  std::vector<Child> children(world_size);
  std::fflush(stdout);
  for (uint32_t r = 0; r < world_size; ++r) {
    int fds[2];
    RETRACE_CHECK(::pipe(fds) == 0, IoError, "pipe failed: ", std::strerror(errno));
    pid_t pid = ::fork();
    RETRACE_CHECK(pid >= 0, IoError, "fork failed: ", std::strerror(errno));
    if (pid == 0) exec_rank(r, world_size, port, fds, args);
    ::close(fds[1]);
    children[r].pid = pid;
    children[r].fd = fds[0];
  }

  int result = 0;
  uint32_t alive = world_size;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    forward_output(children);
    const std::optional<uint32_t> failed_rank = reap_ranks(children, alive);
    if (failed_rank && !stopping) {
      const uint32_t r = *failed_rank;
      const int status = children[r].status;
      std::fflush(stdout);
      std::fprintf(stderr, "retrace: rank %u %s; stopping the other %u rank(s)\n", r, describe(status).c_str(), alive);
      result = exit_code_of(status);
      if (result == 0) result = 4;
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      for (auto& o : children)
        if (!o.done) ::kill(o.pid, SIGTERM);
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      for (auto& o : children)
        if (!o.done) ::kill(o.pid, SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
  }
  for (auto& c : children)
    if (c.fd >= 0) ::close(c.fd);
  return result;
}

}  // namespace retrace::distributed
