// The local launcher behind `retrace record --world-size N` (and `retrace resume --world-size N`):
// starts N rank processes of this same binary on loopback with RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, forwards their output line by line with a
// "[rank r] " prefix, and fails fast: when any rank dies or exits non-zero, the others are stopped
// (SIGTERM, then SIGKILL after 5 s) and the launcher returns non-zero with a message naming the rank.
// It is a convenience on top of the environment rendezvous, not a separate path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::distributed {

// `args` are the arguments after argv[0] for every rank. Returns 0 when every rank exited 0,
// otherwise the first failing rank's exit code (4 when it was killed by a signal).
int launch_local(uint32_t world_size, const std::vector<std::string>& args);

}  // namespace retrace::distributed
