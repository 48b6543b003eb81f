// A keyed bijection of [0, n), computed per index: the epoch order of data::Sampler under
// data.order = "feistel". Nothing of size n is held, so the order of 10^10 windows costs what the
// order of 10 does; an index's image is a pure function of (n, key, index).
//
// Specification (unsigned integer arithmetic only, so the same on every compiler, CPU and
// library; another implementation that follows it gives the same images):
//   m = the smallest bit width with 2^m >= n, at least 2 (so 2 <= m <= 64);
//   a = ceil(m / 2) and b = floor(m / 2) (both at most 32).
//   The network N maps x < 2^m to a value < 2^m:
//     L = x >> b (a bits), R = x & (2^b - 1) (b bits); wl = a, wr = b.
//     For round r = 0, 1, ..., kRounds - 1:
//       f = word 0 of philox4x32_10({R, r, 0, 0}, key) (rng/philox.h; R < 2^32 as wr <= 32)
//       (L, R) <- (R, (L xor f) & (2^wl - 1)), then (wl, wr) <- (wr, wl)
//     After kRounds (an even number) rounds wl = a and wr = b again, and N(x) = L << b | R.
//   The image of i < n: x = N(i); while x >= n, x = N(x) (cycle walking). n = 1: the image of 0 is
//   0 without evaluating N. n = 0 has no index.
// Why a bijection: a round maps (L, R) of widths (wl, wr) to (R, L') of widths (wr, wl), and
// L = L' xor F(R) on the low wl bits recovers its input, so each round, and N, is a bijection of
// [0, 2^m). Following N from i < n, the cycle of i in N's permutation returns to i, which is < n,
// so the walk stops at the first value < n on the cycle after i; distinct i stop at distinct
// values (the walk is invertible by walking N's inverse), so i -> image is a bijection of [0, n).
// Cost: the n walks step over each value of N's cycles at most once, so they take at most 2^m
// evaluations of N (kRounds Philox blocks each) together: on average at most 2^m / n per index,
// which is below 2 for n >= 3 (2^(m-1) < n as m is minimal, or m = 2) and 2 for n = 2.
#pragma once

#include <cstdint>

namespace retrace::rng {

class FeistelPermutation {
 public:
  static constexpr uint32_t kRounds = 6;

  FeistelPermutation(uint64_t n, uint64_t key);
  // The image of i, for i < n (InvariantError otherwise).
  uint64_t operator()(uint64_t i) const;
  uint64_t n() const { return n_; }

 private:
  uint64_t network(uint64_t x) const;

  uint64_t n_;
  uint64_t key_;
  uint32_t left_bits_ = 1;   // a = ceil(m / 2)
  uint32_t right_bits_ = 1;  // b = floor(m / 2)
};

}  // namespace retrace::rng
