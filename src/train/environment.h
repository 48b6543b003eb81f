// The environment part of a run's record (DESIGN.md invariant 5), and its set-up: thread counts
// for torch and for the BLAS library (pinned together so they never oversubscribe the cores),
// deterministic algorithms, CUDA determinism settings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace/records.h"
#include "train/config.h"

namespace retrace::train {

struct ThreadLayout {
  int64_t torch_threads = 1;
  int64_t blas_threads = 1;
  int64_t interop_threads = 1;
};

// Resolves 0 ("auto") thread counts from the number of cores: torch intra-op 1 and BLAS threads =
// cores (capped at 8), since the MLP step is BLAS-bound (MACHINE-FACTS.md). Writes the resolved
// numbers back into the config so they are recorded and replayed.
ThreadLayout resolve_threads(RuntimeConfig& runtime);

// Applies the layout and the determinism flags. Must run before the first torch op. Sets
// CUBLAS_WORKSPACE_CONFIG when unset so cuBLAS is deterministic on CUDA.
void apply_environment(const RuntimeConfig& runtime);

// Key/value fingerprint. Keys starting with "info." are informational and never make two
// fingerprints unequal for comparison purposes (see replay::fingerprint_diffs).
std::vector<trace::KeyValue> fingerprint(const RuntimeConfig& runtime, uint32_t world_size);

std::string retrace_version();

}  // namespace retrace::train
