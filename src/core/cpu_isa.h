// Whether this CPU runs the AVX2 + FMA builds of retrace's own vectorized loops (the fused AdamW,
// train/adamw_kernel.h; the GELU, model/gelu_kernel.h). Each loop has one body, compiled once for
// AVX2 + FMA and once for the x86-64 baseline, with the same bits; this picks which one runs.
// Asked once per process (a function-local static). Torch-free.
#pragma once

namespace retrace {

inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

}  // namespace retrace
