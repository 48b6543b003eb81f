// retrace's own GELU (erf form), model.gelu_impl = "retrace": y = x * Phi(x), Phi the standard
// normal distribution function, and its gradient dy * (Phi(x) + x * phi(x)).
//
// Why it exists: LibTorch's CPU GELU evaluates erf with Sleef's erff_u10 when oneDNN is off, as
// portable numerics needs it off (oneDNN picks its code by CPU). That costs about 3.4 ns per element
// here, and the char GPT evaluates it on 8M elements forward and again backward each step: a third
// of the step's non-GEMM time. This kernel evaluates Phi from a polynomial and one exp shared by
// Phi and phi, vectorized.
//
// Its bits: a fixed sequence of IEEE float operations per element (products, sums and fused
// multiply-adds written out; the file is compiled with -ffp-contract=off, and with
// -fno-trapping-math, which lets the compiler evaluate both sides of a select and never changes a
// value), so every CPU and every build of the loop (AVX2 + FMA, x86-64 baseline) gives the same
// bits, and so does every LibTorch version: the GELU no longer changes with LibTorch. They are not
// LibTorch's bits: a recorded run made before the key existed reads model.gelu_impl = "torch".
//
// Accuracy, measured against double precision by gpt_test's GeluKernel.* over 4M values in
// 2^-20 <= |x| <= 13: the GELU within 6.1 ulp (relative 3.6e-7) wherever Phi >= 1e-30, the
// derivative within 1.8e-7 of the size of its two terms; for |x| >= 13, Phi is flushed to 0 or 1
// and phi to 0 (true values below 1e-36). An AVX-512 build of the loop gave the same bits but no
// measurable gain inside the step (the GPT's step / GEMM 1.54-1.55 against 1.48-1.58), so there is
// none.
//
// Torch-free.
#pragma once

#include <cstdint>

namespace retrace::model {

// y[i] = x[i] * Phi(x[i]) for i < n.
void gelu_forward(const float* x, float* y, int64_t n, bool allow_simd = true);
// dx[i] = dy[i] * (Phi(x[i]) + x[i] * phi(x[i])) for i < n.
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool allow_simd = true);

// The instruction set the loops run with on this CPU: "avx2+fma" or "generic" (same bits).
const char* gelu_kernel_isa();

}  // namespace retrace::model
