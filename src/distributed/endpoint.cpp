#include "distributed/endpoint.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace retrace::distributed {
namespace {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

struct IfAddrs {
  ifaddrs* head = nullptr;
  IfAddrs() {
    RETRACE_CHECK(::getifaddrs(&head) == 0, IoError,
                  "cannot list this host's network interfaces: ", std::strerror(errno));
  }
  ~IfAddrs() { ::freeifaddrs(head); }
  IfAddrs(const IfAddrs&) = delete;
  IfAddrs& operator=(const IfAddrs&) = delete;
};

bool has_address(const ifaddrs* a) {
  return a->ifa_addr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6);
}

// The interface's address, IPv4 first (Gloo's interface device prefers it too); empty when none.
std::string address_of(const std::string& name) {
  IfAddrs all;
  std::string v6;
  for (const ifaddrs* a = all.head; a; a = a->ifa_next) {
    if (!has_address(a) || name != a->ifa_name) continue;
    if (a->ifa_addr->sa_family == AF_INET) return address_text(a->ifa_addr);
    if (v6.empty()) v6 = address_text(a->ifa_addr);
  }
  return v6;
}

std::string interface_holding(const std::string& address) {
  IfAddrs all;
  for (const ifaddrs* a = all.head; a; a = a->ifa_next)
    if (has_address(a) && address_text(a->ifa_addr) == address) return a->ifa_name;
  return "";
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

uint32_t env_u32(const char* name) {
  const std::string v = env(name);
  if (v.empty()) return 0;
  char* end = nullptr;
  const unsigned long x = std::strtoul(v.c_str(), &end, 10);
  RETRACE_CHECK(end && *end == '\0', ConfigError, "environment variable ", name, "=\"", v, "\" is not a number");
  return static_cast<uint32_t>(x);
}
}  // namespace

std::string Endpoint::describe() const {
  std::string names;
  for (const auto& i : interfaces) names += (names.empty() ? "" : ",") + i;
  return names + " " + address + " (" + chosen_by + ")";
}

std::string list_interfaces() {
  IfAddrs all;
  std::string out;
  for (const ifaddrs* a = all.head; a; a = a->ifa_next)
    if (has_address(a)) out += (out.empty() ? "" : ", ") + std::string(a->ifa_name) + " " + address_text(a->ifa_addr);
  return out.empty() ? "none" : out;
}

Endpoint choose_endpoint(const std::string& master_addr, uint16_t master_port) {
  Endpoint e;
  if (const std::string names = env("GLOO_SOCKET_IFNAME"); !names.empty()) {
    size_t start = 0;
    while (start <= names.size()) {
      size_t comma = names.find(',', start);
      if (comma == std::string::npos) comma = names.size();
      const std::string name = names.substr(start, comma - start);
      start = comma + 1;
      if (name.empty()) continue;
      const std::string addr = address_of(name);
      RETRACE_CHECK(!addr.empty(), ConfigError, "GLOO_SOCKET_IFNAME=", names, " names interface \"", name,
                    "\", which this host does not have with an address; it has: ", list_interfaces(),
                    ". Set GLOO_SOCKET_IFNAME to one of them, or unset it to use the route to MASTER_ADDR");
      if (e.address.empty()) e.address = addr;
      e.interfaces.push_back(name);
    }
    RETRACE_CHECK(!e.interfaces.empty(), ConfigError, "GLOO_SOCKET_IFNAME=\"", names, "\" names no interface");
    e.chosen_by = "GLOO_SOCKET_IFNAME";
    return e;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(master_port);
  const int rc = ::getaddrinfo(master_addr.c_str(), port.c_str(), &hints, &found);
  RETRACE_CHECK(rc == 0 && found, ConfigError, "MASTER_ADDR=", master_addr, " does not resolve (", ::gai_strerror(rc),
                "); set it to the address or host name of rank 0's host");
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  std::string last_error;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    // Connecting a UDP socket only asks the kernel for the route: no packet is sent.
    const bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    if (!ok) last_error = std::strerror(errno);
    ::close(fd);
    if (!ok) continue;
    e.address = address_text(reinterpret_cast<const sockaddr*>(&local));
    const std::string name = interface_holding(e.address);
    e.interfaces.push_back(name.empty() ? "?" : name);
    e.chosen_by = "route to MASTER_ADDR " + master_addr;
    return e;
  }
  RETRACE_FAIL(IoError, "no route from this host to MASTER_ADDR=", master_addr, " (", last_error,
               "); this host's interfaces: ", list_interfaces(),
               ". Check the address, or name the interface with GLOO_SOCKET_IFNAME");
}

std::string Launcher::describe() const {
  std::string s = name;
  if (name == "torchrun") {
    s += " (run id " + (run_id.empty() ? std::string("?") : run_id) + ", restart " + std::to_string(restart_count);
    if (agent_store) s += ", agent store";
    s += ")";
  }
  if (local_world_size) s += ", " + std::to_string(local_world_size) + " ranks on this host";
  return s;
}

Launcher launcher_from_environment() {
  Launcher l;
  const std::string agent = env("TORCHELASTIC_USE_AGENT_STORE");
  l.agent_store = agent == "True" || agent == "true" || agent == "1";
  l.restart_count = env_u32("TORCHELASTIC_RESTART_COUNT");
  l.local_world_size = env_u32("LOCAL_WORLD_SIZE");
  l.run_id = env("TORCHELASTIC_RUN_ID");
  if (!l.run_id.empty() || l.agent_store || !env("TORCHELASTIC_RESTART_COUNT").empty()) l.name = "torchrun";
  else if (env("RETRACE_LAUNCHER") == "local") l.name = "retrace";
  else l.name = "env";
  return l;
}

}  // namespace retrace::distributed
