#include "rng/feistel.h"

#include "core/error.h"
#include "rng/philox.h"

namespace retrace::rng {
namespace {
// 2^bits - 1 for bits <= 32 (the widest half of a 64-bit value).
uint64_t low_bits(uint32_t bits) { return (uint64_t{1} << bits) - 1; }
}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  uint32_t m = 2;
  while (m < 64 && (uint64_t{1} << m) < n) ++m;
  left_bits_ = (m + 1) / 2;
  right_bits_ = m / 2;
}

uint64_t FeistelPermutation::network(uint64_t x) const {
  uint32_t wl = left_bits_, wr = right_bits_;
  uint64_t left = x >> wr, right = x & low_bits(wr);
  for (uint32_t r = 0; r < kRounds; ++r) {
    const PhiloxBlock w = philox4x32_10({static_cast<uint32_t>(right), r, 0, 0}, key_);
    const uint64_t new_right = (left ^ w[0]) & low_bits(wl);
    left = right;
    right = new_right;
    const uint32_t t = wl;
    wl = wr;
    wr = t;
  }
  return left << wr | right;
}

uint64_t FeistelPermutation::operator()(uint64_t i) const {
  RETRACE_CHECK(i < n_, InvariantError, "index ", i, " outside the permutation's [0, ", n_, ")");
  if (n_ == 1) return 0;
  uint64_t x = network(i);
  while (x >= n_) x = network(x);
  return x;
}

}  // namespace retrace::rng
