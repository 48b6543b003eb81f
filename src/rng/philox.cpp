#include "rng/philox.h"

#include <climits>
#include <cmath>
#include <cstdint>

#include "core/error.h"

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
  PhiloxBlock out = philox4x32_10(
      PhiloxBlock{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0}, key_);
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
// arithmetic is philox4x32_10's, word for word. One body, inlined into an AVX-512, an AVX2 and an
// x86-64 baseline build (integer operations: the same bits on each). out[i] is element
// 4 * first_block + i of the mask.
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
    const PhiloxBlock w =
        philox4x32_10(PhiloxBlock{static_cast<uint32_t>(idx), static_cast<uint32_t>(idx >> 32), 0, 0}, key);
    for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j) out[4 * b + j] = w[j] < drop_threshold ? 0.0f : keep_scale;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2"))) void dropout_mask_avx512(
    uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n, int64_t first_block) {
  dropout_body(key, drop_threshold, keep_scale, out, n, first_block);
}
__attribute__((target("avx2"))) void dropout_mask_avx2(uint64_t key, uint32_t drop_threshold, float keep_scale,
                                                       float* out, int64_t n, int64_t first_block) {
  dropout_body(key, drop_threshold, keep_scale, out, n, first_block);
}
#endif
void dropout_mask_generic(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n,
                          int64_t first_block) {
  dropout_body(key, drop_threshold, keep_scale, out, n, first_block);
}

}  // namespace

void dropout_mask(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n) {
  dropout_mask_range(key, drop_threshold, keep_scale, out, 0, n);
}

void dropout_mask_range(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t begin,
                        int64_t end) {
  RETRACE_CHECK(begin % 4 == 0 && 0 <= begin && begin <= end, InvariantError, "dropout_mask_range: begin ", begin,
                " must be a multiple of 4 in [0, end = ", end, "]");
  const int64_t n = end - begin, first_block = begin / 4;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return dropout_mask_avx512(key, drop_threshold, keep_scale, out, n, first_block);
  if (avx2) return dropout_mask_avx2(key, drop_threshold, keep_scale, out, n, first_block);
#endif
  dropout_mask_generic(key, drop_threshold, keep_scale, out, n, first_block);
}

}  // namespace retrace::rng
