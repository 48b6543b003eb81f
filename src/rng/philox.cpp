#include "rng/philox.h"

#include <climits>
#include <cmath>
#include <cstdint>

#include "core/cpu_isa.h"
#include "core/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace retrace::rng {
namespace {
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock c, uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = PhiloxBlock{hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

uint64_t PhiloxStream::next_u64() {
  uint64_t block = position_ >> 1;
  PhiloxBlock out = philox4x32_10(PhiloxBlock{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0},
                                  key_);
  int half = static_cast<int>(position_ & 1);
  ++position_;
  return (static_cast<uint64_t>(out[2 * half + 1]) << 32) | out[2 * half];
}

uint64_t PhiloxStream::next_below(uint64_t bound) {
  // Lemire, "Fast random integer generation in an interval" (2019), 64-bit version.
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * bound;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < bound) {
    uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t mix_key(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ b); }

uint32_t dropout_threshold(double p) {
  if (!(p > 0.0)) return 0;
  if (p >= 1.0) return UINT32_MAX;
  return static_cast<uint32_t>(std::floor(std::ldexp(p, 32)));
}

namespace {

// 64 blocks side by side (structure of arrays), so the compiler vectorizes the ten rounds; the
// arithmetic is philox4x32_10's, word for word. The x86-64 baseline build, and the tail of the
// vectorized builds below. out[i] is element 4 * first_block + i of the mask.
inline __attribute__((always_inline)) void dropout_body(uint64_t key, uint32_t drop_threshold, float keep_scale,
                                                        float* out, int64_t n, int64_t first_block) {
  constexpr int64_t kLanes = 64;
  const int64_t blocks = n / 4;
  int64_t b = 0;
  for (; b + kLanes <= blocks; b += kLanes) {
    uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      const uint64_t idx = static_cast<uint64_t>(first_block + b + j);
      c0[j] = static_cast<uint32_t>(idx);
      c1[j] = static_cast<uint32_t>(idx >> 32);
      c2[j] = 0;
      c3[j] = 0;
    }
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[j];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[j];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
        c1[j] = static_cast<uint32_t>(p1);
        c3[j] = static_cast<uint32_t>(p0);
        c0[j] = n0;
        c2[j] = n2;
      }
      k0 += kW0;
      k1 += kW1;
    }
    float* o = out + 4 * b;
    for (int64_t j = 0; j < kLanes; ++j) {
      o[4 * j + 0] = c0[j] < drop_threshold ? 0.0f : keep_scale;
      o[4 * j + 1] = c1[j] < drop_threshold ? 0.0f : keep_scale;
      o[4 * j + 2] = c2[j] < drop_threshold ? 0.0f : keep_scale;
      o[4 * j + 3] = c3[j] < drop_threshold ? 0.0f : keep_scale;
    }
  }
  for (; 4 * b < n; ++b) {
    const uint64_t idx = static_cast<uint64_t>(first_block + b);
    const PhiloxBlock w = philox4x32_10(PhiloxBlock{static_cast<uint32_t>(idx), static_cast<uint32_t>(idx >> 32), 0, 0},
                                        key);
    for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j) out[4 * b + j] = w[j] < drop_threshold ? 0.0f : keep_scale;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The mask by hand-written AVX2 code: 256-bit vectors of eight Philox blocks, each of the four
// counter words in its own vector (structure of arrays), G groups of eight in flight so that one
// group's multiplies overlap the others' latency. Integer operations only: philox4x32_10's words.
//
// Measured on a 2-core Intel Sapphire Rapids VM, one thread, per element: the compiler's own
// vectorization of dropout_body 1.7 ns with AVX2 and 0.81 ns with AVX-512; this code 0.78 ns
// (0.60-0.70 with AVX-512 VL on 256-bit vectors). Inside the GPT step this AVX2 code was the
// fastest of them (tools/bench/limit-ab, step time 0.960 of the 512-bit build's; the VL build
// 1.030, the 512-bit GELU 1.040): AVX-512 instructions slow the core's other work, the GEMMs
// around them, by more than they save, so no AVX-512 build is kept.
namespace avx2 {
#pragma GCC push_options
#pragma GCC target("avx2")
// hi and lo of the 32 x 32 -> 64 bit products a[j] * m for the eight words of a: vpmuludq
// multiplies the even words (the low halves of the 64-bit lanes); the odd words are moved down by
// a shuffle first. The products' halves are then gathered by shuffles and blends.
inline void mulhilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_shuffle_epi32(a, 0xF5), m);
  hi = _mm256_blend_epi32(_mm256_shuffle_epi32(even, 0xF5), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_shuffle_epi32(odd, 0xA0), 0xAA);
}

inline __m256i xor3(__m256i a, __m256i b, __m256i c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }

// All ones in each word where a > b as unsigned integers: AVX2 compares signed, so the sign bits
// of both sides are flipped first.
inline __m256i greater_unsigned(__m256i a, __m256i b) {
  const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  return _mm256_cmpgt_epi32(_mm256_xor_si256(a, flip), _mm256_xor_si256(b, flip));
}

// keep_scale where the word is >= threshold (unsigned), else +0.0f.
inline __m256 keep_where(__m256i words, __m256i threshold, __m256 keep_scale) {
  return _mm256_andnot_ps(_mm256_castsi256_ps(greater_unsigned(threshold, words)), keep_scale);
}

// Blocks [first, first + 8 G) of the mask into out[0, 32 G).
template <int G>
inline void blocks(uint64_t key, __m256i threshold, __m256 keep_scale, float* out, uint64_t first) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i c0[G], c1[G], c2[G], c3[G];
  for (int g = 0; g < G; ++g) {
    // Counter {index low word, index high word, 0, 0}; the high word gains a carry where the low
    // word wraps within the group.
    const uint64_t base = first + 8 * static_cast<uint64_t>(g);
    const __m256i lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base)));
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(base >> 32)));
    c0[g] = _mm256_add_epi32(lo, step);
    c1[g] = _mm256_sub_epi32(hi, greater_unsigned(lo, c0[g]));  // wrapped: -1
    c2[g] = _mm256_setzero_si256();
    c3[g] = _mm256_setzero_si256();
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i kk0 = _mm256_set1_epi32(static_cast<int>(k0)), kk1 = _mm256_set1_epi32(static_cast<int>(k1));
    for (int g = 0; g < G; ++g) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo(c0[g], m0, hi0, lo0);
      mulhilo(c2[g], m1, hi1, lo1);
      c0[g] = xor3(hi1, c1[g], kk0);
      c2[g] = xor3(hi0, c3[g], kk1);
      c1[g] = lo1;
      c3[g] = lo0;
    }
    k0 += kW0;
    k1 += kW1;
  }
  for (int g = 0; g < G; ++g) {
    // Word k of block j goes to out[4 j + k]: a 4 x 8 transpose.
    const __m256 w0 = keep_where(c0[g], threshold, keep_scale), w1 = keep_where(c1[g], threshold, keep_scale);
    const __m256 w2 = keep_where(c2[g], threshold, keep_scale), w3 = keep_where(c3[g], threshold, keep_scale);
    const __m256d t0 = _mm256_castps_pd(_mm256_unpacklo_ps(w0, w1)), t1 = _mm256_castps_pd(_mm256_unpackhi_ps(w0, w1));
    const __m256d t2 = _mm256_castps_pd(_mm256_unpacklo_ps(w2, w3)), t3 = _mm256_castps_pd(_mm256_unpackhi_ps(w2, w3));
    const __m256 b04 = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2)), b15 = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
    const __m256 b26 = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3)), b37 = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
    float* o = out + 32 * g;
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(b04, b15, 0x20));
    _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(b26, b37, 0x20));
    _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(b04, b15, 0x31));
    _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(b26, b37, 0x31));
  }
}

// dropout_body's contract: out[i] is element 4 first_block + i of the mask, i < n.
void fill(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n, int64_t first_block) {
  constexpr int G = 3;  // three groups' 12 vectors and the 4 constants fill the 16 registers
  const __m256i threshold = _mm256_set1_epi32(static_cast<int>(drop_threshold));
  const __m256 keep = _mm256_set1_ps(keep_scale);
  const int64_t whole = n / 4;
  int64_t b = 0;
  for (; b + 8 * G <= whole; b += 8 * G)
    blocks<G>(key, threshold, keep, out + 4 * b, static_cast<uint64_t>(first_block + b));
  for (; b + 8 <= whole; b += 8) blocks<1>(key, threshold, keep, out + 4 * b, static_cast<uint64_t>(first_block + b));
  dropout_body(key, drop_threshold, keep_scale, out + 4 * b, n - 4 * b, first_block + b);
}
#pragma GCC pop_options
}  // namespace avx2
#endif
void dropout_mask_generic(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n,
                          int64_t first_block) {
  dropout_body(key, drop_threshold, keep_scale, out, n, first_block);
}

}  // namespace

void dropout_mask(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n) {
  dropout_mask_range(key, drop_threshold, keep_scale, out, 0, n);
}

bool mask_build_runs(MaskBuild build) { return build != MaskBuild::kAvx2 || cpu_has_avx2(); }

void dropout_mask_range(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t begin, int64_t end,
                        MaskBuild build) {
  RETRACE_CHECK(begin % 4 == 0 && 0 <= begin && begin <= end, InvariantError, "dropout_mask_range: begin ", begin,
                " must be a multiple of 4 in [0, end = ", end, "]");
  RETRACE_CHECK(mask_build_runs(build), InvariantError, "dropout_mask_range: this CPU does not run mask build ",
                static_cast<int>(build));
  const int64_t n = end - begin, first_block = begin / 4;
  if (build == MaskBuild::kFastest) build = mask_build_runs(MaskBuild::kAvx2) ? MaskBuild::kAvx2 : MaskBuild::kBaseline;
#if defined(__x86_64__) && defined(__GNUC__)
  if (build == MaskBuild::kAvx2) return avx2::fill(key, drop_threshold, keep_scale, out, n, first_block);
#endif
  dropout_mask_generic(key, drop_threshold, keep_scale, out, n, first_block);
}

}  // namespace retrace::rng
