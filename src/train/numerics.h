// Numerics profiles: which machine-dependent choices of the kernel libraries a run pins.
//
// The bits of a CPU run follow the code path, not the chip: the OpenBLAS kernel, ATen's CPU
// capability, whether BF16 matmuls go through oneDNN, and the thread counts. Measured on these
// machines: goldens recorded on an Intel VM (OpenBLAS fell back to its Prescott kernel) were
// reproduced with maximum loss difference 0 on an AMD EPYC once OpenBLAS was forced to the same
// kernel; with the kernel each machine picks for itself (Prescott, Zen, Cooperlake) the traces part
// after a few dozen steps, and OpenBLAS at 1, 2, 3, 4 and 8 threads gives five different traces.
//
//   portable (default)  every such choice is pinned to one that every x86-64-v3 CPU (AVX2 + FMA)
//                       executes identically: the pins below, BF16 matmuls on ATen's own kernels
//                       (oneDNN is chosen by CPU features: AVX-512 BF16 and AMX on some parts and
//                       not others). Two x86-64-v3 machines give the same trace. Version 1 (every
//                       run recorded before runtime.numerics_version existed) also fixes the thread
//                       counts (torch 1, OpenBLAS 2) when the config says 0; version 2, the default,
//                       runs retrace's kernels (GEMMs on BLIS, kernels/gemm.h), whose bits do not
//                       depend on the thread count, on every core (environment.h).
//   native              whatever the machine picks, for speed; the bits are this machine's.
//
// Which BLAS does the matmuls depends on the LibTorch: Debian's calls libblas.so.3 (OpenBLAS, set
// by tools/setup.sh), the PyPI wheels link Intel MKL in. Portable pins the one that is there:
// OpenBLAS's Haswell kernel, or MKL's AVX2 code path (MKL_CBWR, its "conditional numerical
// reproducibility"). The two libraries round differently, so runs compare bitwise only within one
// BLAS (the fingerprint's "blas" field says which).
//
// OpenBLAS picks its kernel when the library loads, before main, so the pins are environment
// variables that must be in place when the process starts. prepare_process() does that for a
// program by re-executing it once (/proc/self/exe, same arguments) with the variables set; a
// variable that is already set and was not set by retrace is respected, never overridden (some
// machines set OPENBLAS_CORETYPE on purpose because older OpenBLAS computes wrong results on
// them), and recorded: such a run is portable only among machines with the same setting.
//
// This header is torch-free; environment.h applies the rest (threads, oneDNN) and checks that the
// process really runs what the profile promises.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace retrace::train {

enum class Numerics : uint8_t { kPortable, kNative };

// "portable" | "native"; ConfigError naming runtime.numerics for anything else.
Numerics parse_numerics(const std::string& name);
const char* numerics_name(Numerics n);

// One setting that portable numerics pins: an environment variable a kernel library reads once.
struct NumericsPin {
  const char* variable;
  const char* value;
  const char* what;  // for messages and docs/determinism.md
};
// The pins for the BLAS this process links (MKL's when blas_in_process() finds it, else
// OpenBLAS's), then ATen's.
const std::vector<NumericsPin>& portable_pins();

enum class BlasKind : uint8_t { kOpenBlas, kMkl, kOther };
// Found by the libraries' own exported symbols (openblas_get_corename, MKL_Get_Version_String).
BlasKind blas_in_process();

// Thread counts that portable numerics resolves "0 (auto)" to: fixed numbers, never the core count.
inline constexpr int kPortableTorchThreads = 1;
inline constexpr int kPortableBlasThreads = 2;

// The environment variable in which retrace lists the variables it set itself (comma separated),
// so that a re-executed process, and the ranks it launches, can tell its own pins from a user's.
inline constexpr const char* kPinnedVariable = "RETRACE_NUMERICS_PINNED";

// What the CPU offers that the profiles care about. `x86_64_v3` is AVX2 + FMA (+ BMI1/2, F16C,
// MOVBE, LZCNT), which every pinned kernel needs. `flags` lists the features that change which
// kernels a library picks natively (AVX-512 parts, BF16, AMX), as recorded in the fingerprint.
struct CpuFeatures {
  bool x86_64_v3 = false;
  std::vector<std::string> missing;  // the v3 features absent, when x86_64_v3 is false
  std::vector<std::string> flags;
};
// The running CPU. RETRACE_CPU_FEATURES (a testing aid: "avx2,fma,..." or "none") replaces what
// the CPU reports, to exercise the refusal below on a machine that has the features.
CpuFeatures detect_cpu_features();
// IoError (exit 4) when `n` is portable and the CPU cannot run the pinned kernels; the message
// names runtime.numerics = "native".
void check_cpu(Numerics n, const CpuFeatures& cpu);

// How the process environment must change before a run of profile `n` can start.
struct EnvPlan {
  std::vector<std::pair<std::string, std::string>> set;        // variable, value
  std::vector<std::string> unset;                              // pins retrace set that native drops
  std::vector<std::pair<std::string, std::string>> respected;  // set by the user to another value
  bool ready() const { return set.empty() && unset.empty(); }
};
EnvPlan plan_environment(Numerics n);

// For a program's main, before it does anything else that the pins could affect: when the
// environment is not what `n` needs, re-executes this program with the same arguments and the
// variables of plan_environment(n) in place; returns when it already is. IoError when exec fails.
void prepare_process(Numerics n, char** argv);

// One line for people: the profile, what is pinned, what was respected; `fixed_threads` names the
// thread counts among the pins (portable version 1: they are; version 2: information).
std::string describe_numerics(Numerics n, const EnvPlan& plan, bool fixed_threads = true);

}  // namespace retrace::train
