// The GEMM of portable numerics version 2 (issue 51, docs/determinism.md "Numerics versions"):
// Debian's BLIS 0.9 (the pthread flavour), loaded at run time, each call on a given number of
// BLIS's own threads with its small-matrix ("sup") path off. Torch-free.
//
// Why BLIS, and why these settings (measured, docs/plans/owned-numerics.md 2.6, and checked by the
// GemmThreads and GemmTiles properties): BLIS never splits a GEMM's k dimension between threads, so
// every element of C is summed in one order whatever the thread count; its packed path computes an
// element the same way whatever tile or orientation it sits in, while the small-matrix path does
// not; and its own threads were faster than tiles of single-threaded calls on a pool of ours.
// OpenBLAS gives other bits at every thread count; MKL's thread-count-independent mode exists only
// inside the 2.x wheel. One system library loaded by either LibTorch build gives both the same GEMM.
//
// Loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), never linked: linked, BLIS's sgemm_ would come
// before libblas.so.3 and take over ATen's own GEMMs (the pinned profile's). Only bli_* functions
// are called.
#pragma once

#include <cstdint>
#include <string>

namespace retrace::kernels {

// What was loaded: the file, BLIS's version string and the kernel configuration it chose for this
// CPU ("haswell"). The configuration's block sizes decide how k is cut into panels, so it is part
// of the bits (the fingerprint's numerics field "gemm").
struct GemmLibrary {
  std::string path;
  std::string version;
  std::string arch;
  std::string describe() const { return "BLIS " + version + " " + arch; }
};

// The default file, Debian's libblis4-pthread; $RETRACE_BLIS_LIBRARY names another (a testing aid,
// to exercise the refusals).
inline constexpr const char* kBlisLibrary = "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4";

// Loads BLIS on first use (thread-safe) and returns what it found. IoError (exit 4) naming the
// library, the package and the way out when the file is missing, is not BLIS, or is not version
// 0.9 (the per-call settings are compiled from 0.9's header).
const GemmLibrary& gemm_library();

// C = A B (+ C when accumulate), single precision, any strides: element (i, p) of A at
// a[i * rsa + p * csa], (p, j) of B at b[p * rsb + j * csb], (i, j) of C at c[i * rsc + j * csc].
// Transposed operands are strides, never copies. m, n, k >= 0 (k = 0 sets C to 0, or leaves it).
// `threads`: BLIS's own threads for this call (the same bits at any count: GemmThreads). The step
// calls it with 1 on retrace's lanes, a tile of C each (model/owned_linear.cpp: BLIS creates and
// joins its threads in every call, about 60 us here, and they wait for each other spinning, which
// oversubscribed cores turn into milliseconds).
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t rsb,
          int64_t csb, float* c, int64_t rsc, int64_t csc, bool accumulate = false, int threads = 1);

}  // namespace retrace::kernels
