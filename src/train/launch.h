#pragma once
// Portable numerics' pins for a process that has not loaded the BLAS yet: the retrace launcher
// (tools/retrace/launcher.cpp), which puts them in place before it executes the trainer.
// Implemented in numerics.cpp, beside prepare_process.
#include <cstdint>
#include <vector>

#include "train/numerics.h"

namespace retrace::train {

// The pins for a BLAS (MKL's for kMkl, else OpenBLAS's), then ATen's. portable_pins() is
// portable_pins_for(blas_in_process()).
const std::vector<NumericsPin>& portable_pins_for(BlasKind blas);

// plan_environment(n) for a given BLAS instead of the one in this process.
EnvPlan plan_environment(Numerics n, BlasKind blas);

// How long an idle OpenBLAS worker spins before it sleeps: 2^22 TSC ticks (about 2 ms) instead of
// OpenBLAS's 2^28 (about 0.1 s). It changes no bits: only when the workers sleep. Set by
// fit_thread_timeout where the user has not set it, and listed with the pins. With the default,
// the worker spins on the second core through the GPT's elementwise stretches between GEMMs
// (milliseconds each), where the helper lane (model/lanes.h) needs that core; at 2^22 it sleeps
// there, and stays awake between the MLP's GEMMs, which come closer together.
// tools/bench/vs-pytorch gives matched PyTorch the same value. On a 2-core Intel VM
// (tools/bench/binary-ab, steps/s with it / without it, 6 paired rounds): GPT 1.139
// [1.128, 1.154], MLP 1.000 [0.962, 1.030]; at 2^16 the MLP lost 12 %, at 2^24 the GPT gained
// nothing (docs/performance.md, OpenBLAS's idle worker). Where ranks share the cores (two ranks on
// two), a sleeping worker made the GPT about 20 % slower (steps/s 0.81x), so there it is not set.
inline constexpr NumericsPin kThreadTimeout{"OPENBLAS_THREAD_TIMEOUT", "22", "OpenBLAS worker spin"};

// Whether this process may use two cores per local rank, as a helper lane needs (model/lanes.h;
// runtime.elementwise_threads' auto rule): its affinity and cgroup quota count (core/cpu_budget.h).
bool room_for_helper_lane(int64_t local_ranks);
// The local ranks of this process's run: LOCAL_WORLD_SIZE (set by torchrun and retrace's own
// launcher), else 1.
int64_t local_ranks_from_env();

// Sets kThreadTimeout (OpenBLAS only) where there is room for a helper lane for `local_ranks`, and
// drops retrace's own value where there is not (the children of retrace's own rank launcher, which
// inherit it). A value the user set is left alone.
void fit_thread_timeout(BlasKind blas, int64_t local_ranks);

// Puts portable's pins for `blas` in the environment, as prepare_process would, on a CPU that can
// run them (portable refuses the others, native needs no pins), and fits kThreadTimeout to the
// local ranks in the environment (fit_thread_timeout). The program the launcher then executes
// starts ready for a portable run, without executing itself again; a native run drops the pins
// (one re-execution) and keeps the timeout.
void pin_before_start(BlasKind blas);

// Sets and unsets the plan's variables in this process's environment and lists the ones set in
// kPinnedVariable (prepare_process, before it re-executes; pin_before_start).
void apply_plan(const EnvPlan& plan);

}  // namespace retrace::train
