// Which local network interface and address a rank's Gloo transport binds, and who launched it.
//
// c10d's C++ ProcessGroupGloo does not read GLOO_SOCKET_IFNAME (PyTorch reads it in Python), and
// its default device binds whatever the hostname resolves to, which Debian maps to 127.0.1.1: a
// rank on another host could never reach it. So retrace chooses, in this order:
//   1. GLOO_SOCKET_IFNAME (a comma-separated list of interfaces, as in PyTorch): one Gloo device
//      per interface, each bound to its interface's address;
//   2. otherwise the address this host would send from to reach MASTER_ADDR (the kernel's route,
//      asked by connecting a UDP socket, which sends nothing), on the interface that holds it.
// NCCL reads its own variables (NCCL_SOCKET_IFNAME, ...) itself; retrace leaves them alone and
// records them. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::distributed {

struct Endpoint {
  std::vector<std::string> interfaces;  // e.g. {"eth0"}; several only from GLOO_SOCKET_IFNAME
  std::string address;                  // this rank's address on the first interface, e.g. "10.0.0.2"
  std::string chosen_by;                // "GLOO_SOCKET_IFNAME" or "route to MASTER_ADDR 10.0.0.1"
  std::string describe() const;         // "vethB 10.77.0.2 (route to MASTER_ADDR 10.77.0.1)"
};

// ConfigError when GLOO_SOCKET_IFNAME names an interface this host lacks (listing those it has)
// or MASTER_ADDR does not resolve; IoError when no route leads to MASTER_ADDR.
Endpoint choose_endpoint(const std::string& master_addr, uint16_t master_port);

// The interfaces of this host with an IPv4 or IPv6 address, "lo 127.0.0.1, eth0 10.0.0.2".
std::string list_interfaces();

// How the rank was started, from the launcher's variables: torchrun's (TORCHELASTIC_RUN_ID,
// TORCHELASTIC_RESTART_COUNT, LOCAL_WORLD_SIZE, TORCHELASTIC_USE_AGENT_STORE), retrace's own
// launcher (RETRACE_LAUNCHER=local) or a plain environment launch.
struct Launcher {
  std::string name;               // "torchrun", "retrace", "env"
  bool agent_store = false;       // TORCHELASTIC_USE_AGENT_STORE: the agent serves the TCPStore
  uint32_t restart_count = 0;     // TORCHELASTIC_RESTART_COUNT
  uint32_t local_world_size = 0;  // LOCAL_WORLD_SIZE, 0 when unset
  std::string run_id;             // TORCHELASTIC_RUN_ID
  std::string describe() const;   // "torchrun (run id x, restart 0, agent store, 2 ranks on this host)"
};
Launcher launcher_from_environment();

}  // namespace retrace::distributed
