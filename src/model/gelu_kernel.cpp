#include "model/gelu_kernel.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/cpu_isa.h"

namespace retrace::model {
namespace {

constexpr float kInvSqrt2 = 0.707106781f;    // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.398942280f;  // 1/sqrt(2 pi)
constexpr float kLog2e = 1.44269504f;
constexpr float kLn2Hi = 0.693145752f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi with 9 low zero bits
constexpr float kLn2Lo = 1.42860677e-06f;
constexpr float kRound = 12582912.0f;    // 1.5 * 2^23: (v + kRound) - kRound rounds v to an integer
constexpr float kFlush = 13.0f;          // |x| from which Phi is 0 or 1 and phi is 0
constexpr float kMaxHalfSquare = 84.5f;  // x^2 / 2 at kFlush: exp(-84.5) is still a normal float

// erf(u) = u * sum_n kErf[n] u^(2n) for |u| < 0.5: the Taylor series, 2/sqrt(pi) (-1)^n / (n! (2n+1)),
// to n = 7 (the next term is below 3e-11 there).
constexpr double taylor(int n) {
  double f = 1;
  for (int k = 2; k <= n; ++k) f *= k;
  return (n % 2 ? -1.0 : 1.0) * 1.1283791670955126 / (f * (2 * n + 1));
}
constexpr float kErf[] = {static_cast<float>(taylor(0)), static_cast<float>(taylor(1)), static_cast<float>(taylor(2)),
                          static_cast<float>(taylor(3)), static_cast<float>(taylor(4)), static_cast<float>(taylor(5)),
                          static_cast<float>(taylor(6)), static_cast<float>(taylor(7))};

// erfc(z) = exp(-z^2) * w * sum_k kTail[k] s^k for z = |u| >= 0.5, w = 1/(1 + z), s = kTailA w +
// kTailB: a least-squares fit (relative error 4e-9 in double) made by tools/numerics/gelu_fit.py.
constexpr float kTailA = 3.51724138f, kTailB = -1.34482759f;
constexpr float kTail[] = {0.794217446f,     0.158578452f,     -0.0246326309f,   -0.00777409856f,
                           0.00349358975f,   -0.000107839351f, -0.000370076094f, 0.000150906217f,
                           -6.21067736e-06f, -2.18491919e-05f, 7.15130184e-06f,  6.79607093e-07f};

// sum_k c[k] v^k by Horner's rule, highest power first, written out (a loop here would keep the
// element loop from vectorizing).
template <size_t N, size_t K = N - 1>
inline __attribute__((always_inline)) float horner(const float (&c)[N], float v, float acc) {
  if constexpr (K == 0) {
    return std::fma(acc, v, c[0]);
  } else {
    return horner<N, K - 1>(c, v, std::fma(acc, v, c[K]));
  }
}
template <size_t N>
inline __attribute__((always_inline)) float horner(const float (&c)[N], float v) {
  return horner<N, N - 2>(c, v, c[N - 1]);
}

inline __attribute__((always_inline)) float from_bits(int32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// exp(-h - l) for h in [0, kMaxHalfSquare], l a correction far below h's ulp: Cody-Waite
// reduction by ln 2, the Taylor polynomial of degree 7 on |r| <= ln2/2, then 2^k from its bits.
inline __attribute__((always_inline)) float exp_neg(float h, float l) {
  const float k = ((-h * kLog2e) + kRound) - kRound;
  float r = std::fma(k, -kLn2Hi, -h);
  r = std::fma(k, -kLn2Lo, r);
  r = r - l;
  float p = 1.0f / 5040;
  p = std::fma(p, r, 1.0f / 720);
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return p * from_bits((static_cast<int32_t>(k) + 127) << 23);
}

// Phi(x) and exp(-x^2 / 2), from which phi(x) = kInvSqrt2Pi * e.
struct Parts {
  float cdf, e;
};

inline __attribute__((always_inline)) Parts parts(float x) {
  const float a = std::fabs(x);
  // x^2 / 2 as hi + lo: the square's rounding error recovered by a fused multiply-add, then halved
  // exactly. Clamped, so exp_neg stays in range; beyond kFlush its value is not used.
  const float sq = x * x;
  const float sq_lo = std::fma(x, x, -sq);
  const float half_sq = 0.5f * sq;
  const float h = half_sq > kMaxHalfSquare ? kMaxHalfSquare : half_sq;  // a NaN stays NaN
  const float l = 0.5f * sq_lo;
  const float e = exp_neg(h, l);
  // |u| < 0.5 (u = x / sqrt 2): erf by its series in u^2 = h + l; Phi = 0.5 + 0.5 erf(u) >= 0.24.
  const float u = x * kInvSqrt2;
  const float u2 = h + l;
  const float q = horner(kErf, u2);
  const float near = std::fma(0.5f * u, q, 0.5f);
  // |u| >= 0.5: erfc(|u|) from exp(-u^2) and the tail polynomial; Phi = erfc/2 below 0 (no
  // cancellation however small Phi gets), 1 - erfc/2 above.
  const float z = std::fabs(u);
  const float w = 1.0f / (1.0f + z);
  const float s = std::fma(w, kTailA, kTailB);
  const float p = horner(kTail, s);
  const float half_erfc = 0.5f * (e * (p * w));
  const float far = x < 0 ? half_erfc : 1.0f - half_erfc;
  float cdf = z < 0.5f ? near : far;
  cdf = a >= kFlush ? (x < 0 ? 0.0f : 1.0f) : cdf;
  return {cdf, a >= kFlush ? 0.0f : e};
}

inline __attribute__((always_inline)) void forward_body(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * parts(x[i]).cdf;
}

inline __attribute__((always_inline)) void backward_body(const float* __restrict dy, const float* __restrict x,
                                                         float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const Parts p = parts(x[i]);
    // Beyond kFlush the derivative is Phi itself (0 or 1), also at the infinities.
    const float d = std::fabs(x[i]) >= kFlush ? p.cdf : std::fma(x[i], kInvSqrt2Pi * p.e, p.cdf);
    dx[i] = dy[i] * d;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void forward_avx2(const float* __restrict x, float* __restrict y, int64_t n) {
  forward_body(x, y, n);
}
__attribute__((target("avx2,fma"))) void backward_avx2(const float* __restrict dy, const float* __restrict x,
                                                       float* __restrict dx, int64_t n) {
  backward_body(dy, x, dx, n);
}
#endif

void forward_generic(const float* __restrict x, float* __restrict y, int64_t n) { forward_body(x, y, n); }
void backward_generic(const float* __restrict dy, const float* __restrict x, float* __restrict dx, int64_t n) {
  backward_body(dy, x, dx, n);
}

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, bool allow_simd) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (allow_simd && cpu_has_avx2_fma()) return forward_avx2(x, y, n);
#endif
  forward_generic(x, y, n);
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool allow_simd) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (allow_simd && cpu_has_avx2_fma()) return backward_avx2(dy, x, dx, n);
#endif
  backward_generic(dy, x, dx, n);
}

const char* gelu_kernel_isa() { return cpu_has_avx2_fma() ? "avx2+fma" : "generic"; }

}  // namespace retrace::model
