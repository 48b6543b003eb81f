// Whether this CPU runs the AVX2 builds of retrace's own vectorized loops: AVX2 alone for the
// dropout mask (rng/philox.h), AVX2 + FMA for the fused AdamW (train/adamw_kernel.h) and the GELU
// (model/gelu_kernel.h), AVX-512 DQ for the position-mixed sums (core/digest.h). Each loop also has an x86-64 baseline build with the same bits; these
// pick which one runs. Asked once per process (a function-local static). Torch-free.
#pragma once

namespace retrace {

inline bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = cpu_has_avx2() && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// AVX-512 F + DQ: 64-bit multiplies in vectors (the position-mixed sums of core/digest.h).
inline bool cpu_has_avx512dq() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return yes;
#else
  return false;
#endif
}

}  // namespace retrace
