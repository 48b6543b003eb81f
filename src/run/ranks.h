// Rank wiring: this process's rank of a data-parallel run, from the rendezvous variables a
// launcher sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: torchrun, Slurm,
// Kubernetes, or `--world-size N`'s local launcher).
#pragma once

#include <cstdint>
#include <memory>

#include "distributed/process_group.h"
#include "train/config.h"

namespace retrace::run {

// The process group when the variables are set and WORLD_SIZE > 1, else nullptr. Its timeout and
// device come from `config` (the run's own: the recorded one on resume). ConfigError when
// world_flag (--world-size, 0 or 1: unset) contradicts WORLD_SIZE.
std::unique_ptr<distributed::ProcessGroup> join_ranks(const train::Config& config, int64_t world_flag);

}  // namespace retrace::run
