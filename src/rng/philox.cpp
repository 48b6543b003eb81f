#include "rng/philox.h"

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

}  // namespace retrace::rng
