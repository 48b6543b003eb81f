#pragma once
// Portable numerics' pins for a process that has not loaded the BLAS yet: the retrace launcher
// (tools/retrace/launcher.cpp), which puts them in place before it executes the trainer.
// Implemented in numerics.cpp, beside prepare_process.
#include <vector>

#include "train/numerics.h"

namespace retrace::train {

// The pins for a BLAS (MKL's for kMkl, else OpenBLAS's), then ATen's. portable_pins() is
// portable_pins_for(blas_in_process()).
const std::vector<NumericsPin>& portable_pins_for(BlasKind blas);

// plan_environment(n) for a given BLAS instead of the one in this process.
EnvPlan plan_environment(Numerics n, BlasKind blas);

// Puts portable's pins for `blas` in the environment, as prepare_process would, on a CPU that can
// run them (portable refuses the others, native needs no pins). The program the launcher then
// executes starts ready for a portable run, without executing itself again; a native run drops
// the pins (one re-execution).
void pin_before_start(BlasKind blas);

// Sets and unsets the plan's variables in this process's environment and lists the ones set in
// kPinnedVariable (prepare_process, before it re-executes; pin_before_start).
void apply_plan(const EnvPlan& plan);

}  // namespace retrace::train
