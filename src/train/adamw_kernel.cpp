#include "train/adamw_kernel.h"

#include <cmath>

#include "core/cpu_isa.h"

namespace retrace::train {

AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                     int64_t step) {
  // LibTorch computes these in double and hands them to float kernels as Scalars (cast to float).
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamWCoefficients c{};
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(eps);
  c.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return c;
}

namespace {

// One body, inlined into an AVX2+FMA build (vectorized, what LibTorch's own kernels use on these
// CPUs) and into the x86-64 baseline build (std::fma becomes a libm call there). Scaled: the
// gradient is first multiplied by s and the product stored back, what g.mul_(s) does.
template <bool Scaled>
inline __attribute__((always_inline)) void update_body(float* __restrict p, float* __restrict g, float* __restrict m,
                                                       float* __restrict v, int64_t n, const AdamWCoefficients c,
                                                       const float s) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if constexpr (Scaled) {
      gi = gi * s;
      g[i] = gi;
    }
    const float pi = p[i] * c.decay;
    const float mi = std::fma(gi, c.one_minus_beta1, m[i] * c.beta1);
    const float vi = std::fma(c.one_minus_beta2 * gi, gi, v[i] * c.beta2);
    const float denom = std::sqrt(vi) / c.sqrt_bias_correction2 + c.eps;
    p[i] = pi + (c.neg_step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <bool Scaled>
__attribute__((target("avx2,fma"))) void update_avx2(float* __restrict p, float* __restrict g, float* __restrict m,
                                                     float* __restrict v, int64_t n, const AdamWCoefficients c,
                                                     const float s) {
  update_body<Scaled>(p, g, m, v, n, c, s);
}
#endif

template <bool Scaled>
void update_generic(float* __restrict p, float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                    const AdamWCoefficients c, const float s) {
  update_body<Scaled>(p, g, m, v, n, c, s);
}

}  // namespace

void adamw_update(float* p, float* g, float* m, float* v, int64_t n, const AdamWCoefficients& c, bool allow_simd,
                  LaneSums* sums, const float* grad_scale, uint64_t* mixed, uint64_t first_position, Mix mix) {
  const float s = grad_scale ? *grad_scale : 1.0f;
  auto update = [&](int64_t off, int64_t len) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (allow_simd && cpu_has_avx2_fma()) {
      if (grad_scale) return update_avx2<true>(p + off, g + off, m + off, v + off, len, c, s);
      return update_avx2<false>(p + off, g + off, m + off, v + off, len, c, s);
    }
#endif
    if (grad_scale) return update_generic<true>(p + off, g + off, m + off, v + off, len, c, s);
    update_generic<false>(p + off, g + off, m + off, v + off, len, c, s);
  };
  if (!sums && !mixed) return update(0, n);
  // 4 KiB of each array per chunk (a multiple of 64 bytes, as LaneSums needs): the four arrays'
  // chunks fit the L1 cache, so the three written ones are summed from it. Elements are
  // independent, so chunking keeps the bits.
  constexpr int64_t kChunk = 1024;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = n - off < kChunk ? n - off : kChunk;
    update(off, len);
    if (sums) {
      const size_t bytes = static_cast<size_t>(len) * sizeof(float);
      sums[0].add(p + off, bytes);
      sums[1].add(m + off, bytes);
      sums[2].add(v + off, bytes);
    }
    if (mixed) {
      const uint64_t at = first_position + static_cast<uint64_t>(off), count = static_cast<uint64_t>(len);
      mixed[0] += mixed_sum(p + off, sizeof(float), count, at, mix);
      mixed[1] += mixed_sum(m + off, sizeof(float), count, at, mix);
      mixed[2] += mixed_sum(v + off, sizeof(float), count, at, mix);
      mixed[3] += mixed_sum(g + off, sizeof(float), count, at, mix);
    }
  }
}

const char* adamw_kernel_isa() { return cpu_has_avx2_fma() ? "avx2+fma" : "generic"; }

}  // namespace retrace::train
