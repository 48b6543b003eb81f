// The environment part of a run's record, and its set-up: thread counts
// for torch and for the BLAS library (pinned together so they never oversubscribe the cores),
// deterministic algorithms, CUDA determinism settings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "records/records.h"
#include "train/config.h"
#include "train/resolved_config.h"

namespace retrace::train {

struct ThreadLayout {
  int64_t torch_threads = 1;
  int64_t blas_threads = 1;
  int64_t interop_threads = 1;
};

// Resolves 0 ("auto") thread counts: torch intra-op 1 (the MLP step is BLAS-bound: 55-65 % of it is
// sgemm), and BLAS threads 2 under portable numerics (a fixed number: each OpenBLAS thread count
// gives other bits) or the core count capped at 8 under native. Writes the resolved numbers back
// into the config so they are recorded and replayed.
ThreadLayout resolve_threads(RuntimeConfig& runtime);

// A parsed config as this process runs it: its thread counts resolved here (resolve_threads), then
// its texts and hash (resolved_config.h). Once per command; the value is passed on by const&.
ResolvedConfig resolve_here(Config parsed);

// Numerics version 2: the threads of retrace's kernels (GEMMs and lanes) and where the count came
// from: runtime.threads, or with 0 the cores this process may use (core/cpu_budget.h).
struct KernelThreads {
  int64_t count = 1;
  std::string from;
};
KernelThreads kernel_threads(const RuntimeConfig& runtime);

// Whether every kernel of this run's training step is retrace's own under portable numerics
// version 2, so that its bits are the same on the 1.13 and the 2.x build (measured: the MLP and the
// char GPT, numerics_v2's cross-build goldens): version 2 on the CPU, a built-in model (mlp, gpt)
// with the implementation keys at their defaults (philox dropout, retrace GELU, lanes attention,
// activation relu or gelu), the cross-entropy loss, the fused AdamW, no autocast, one rank.
// Anything else keeps a LibTorch kernel somewhere (tanh, SGD's ops, bf16 GEMMs, Gloo's sums), and
// its LibTorch version and BLAS stay numerics fields of the fingerprint.
bool owned_step(const Config& c, uint32_t world_size);

// Whether batch invariance may run in one piece (model/chunk_layout.h, StepPolicy::chunked_sums):
// runtime.invariance = "batch" under version 2 on the CPU, the MLP with philox dropout, the
// cross-entropy loss and no autocast, so that every kernel that sums over samples is one that sums
// by chunks. Data parallelism and bisection's probe still compute chunks piecewise (train_step's
// caller checks those); so does the GPT, whose LayerNorm, embedding and tied head sum over samples
// in kernels that do not yet.
bool chunked_sums_apply(const Config& c);

// runtime.elementwise_threads resolved: the lanes of model/lanes.h, 1 or 2 (never changes bits).
int elementwise_threads(const RuntimeConfig& runtime);

// Applies the layout and the determinism flags. Must run before the first torch op. Sets
// CUBLAS_WORKSPACE_CONFIG when unset so cuBLAS is deterministic on CUDA.
void apply_environment(const RuntimeConfig& runtime);

// Key/value fingerprint in two parts. Numerics fields (everything that changes bits: numerics
// profile, LibTorch and libc versions, ATen capability, BLAS library, kernel and threads, torch
// threads, deterministic flags, oneDNN on or off, device, world size, and under native numerics
// the CPU features that steer kernel choice) and information fields, whose keys start with
// "info." (host, CPU model and features, cores, allocator, the environment variables that were
// set and which of them retrace set): those never make two fingerprints unequal for comparison
// (records::numerics_differences).
//
// Under portable numerics: apply_environment refuses to start unless the pins are in force
// (prepare_process), turns oneDNN off, and resolve_threads gives fixed thread counts.
std::vector<records::KeyValue> fingerprint(const RuntimeConfig& runtime, uint32_t world_size);

// One line for the run's output: the numerics profile, what it pins, what the environment set.
std::string numerics_summary(const RuntimeConfig& runtime);

std::string retrace_version();
// `retrace --version`: "retrace 0.1.0, LibTorch 2.11.0 with CUDA 13.0 and cuDNN 9.19.0, BLAS MKL".
std::string build_description();

// Gives the calling thread the thread counts apply_environment last set. OpenBLAS's pool is
// global, but MKL (the wheels' BLAS) keeps a count per thread, which ATen sets only in the thread
// that calls set_num_threads: another thread stepping a model (the ranks-as-threads of the
// property tests, a user's worker thread) would run MKL with its default, the core count, and
// get other bits. train_step calls this first; it costs a thread-local compare after the first.
void adopt_thread_settings();

// runtime.device = "cuda" needs a LibTorch with CUDA (else ConfigError) and a visible device for
// this rank (else IoError). Called by apply_environment and before ranks join.
void check_device(const RuntimeConfig& runtime);

// The run's CUDA device index: LOCAL_RANK (0 when unset) when runtime.device = "cuda", else -1.
int cuda_index(const RuntimeConfig& runtime);

}  // namespace retrace::train
