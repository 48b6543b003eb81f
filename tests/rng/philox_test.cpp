#include "rng/philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "rng/shuffle.h"

namespace retrace::rng {
namespace {

TEST(Philox, KnownAnswer) {
  // Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors):
  // counter 0, key 0 and counter/key all ones.
  PhiloxBlock a = philox4x32_10({0, 0, 0, 0}, 0);
  EXPECT_EQ(a, (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  PhiloxBlock b = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffffffffffull);
  EXPECT_EQ(b, (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  PhiloxBlock c = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0x299f31d0a4093822ull);
  EXPECT_EQ(c, (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StreamIsAFunctionOfKeyAndPosition) {
  PhiloxStream s(42);
  std::vector<uint64_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(s.next_u64());
  PhiloxStream t(42, 5);
  for (int i = 5; i < 10; ++i) EXPECT_EQ(t.next_u64(), first[i]);
  PhiloxStream u(43);
  EXPECT_NE(u.next_u64(), first[0]);
}

TEST(Philox, NextBelowStaysInRangeAndCoversIt) {
  PhiloxStream s(7);
  std::vector<int> counts(6, 0);
  for (int i = 0; i < 6000; ++i) {
    uint64_t v = s.next_below(6);
    ASSERT_LT(v, 6u);
    counts[v]++;
  }
  for (int c : counts) EXPECT_GT(c, 800);
}

TEST(Philox, DropoutMaskIsTheSpecifiedFunctionOfKeyAndIndex) {
  // Element i: word i % 4 of block i / 4, below the threshold means dropped. Sizes cover the
  // vector loop (64 blocks at a time), its tail and the scalar tail.
  const uint64_t key = 0x0123456789abcdefull;
  const uint32_t threshold = dropout_threshold(0.25);
  EXPECT_EQ(threshold, 1u << 30);
  for (int64_t n : {0, 1, 3, 4, 5, 255, 256, 257, 259, 1000, 65536 + 7}) {
    std::vector<float> out(static_cast<size_t>(n), -1.0f);
    dropout_mask(key, threshold, 4.0f / 3.0f, out.data(), n);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t b = static_cast<uint64_t>(i / 4);
      const auto w = philox4x32_10({static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0, 0}, key);
      const float expected = w[i % 4] < threshold ? 0.0f : 4.0f / 3.0f;
      mismatches += out[static_cast<size_t>(i)] != expected;
    }
    EXPECT_EQ(mismatches, 0) << "n = " << n;
  }
  // The dropped fraction is p (binomial: 1M elements, p = 0.1, sd 3e-4; 0.003 is 10 sd).
  std::vector<float> big(1 << 20);
  dropout_mask(7, dropout_threshold(0.1), 1.0f, big.data(), static_cast<int64_t>(big.size()));
  int64_t dropped = 0;
  for (float x : big) dropped += x == 0.0f;
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(big.size()), 0.1, 0.003);
  EXPECT_EQ(dropout_threshold(0.0), 0u);
  EXPECT_EQ(dropout_threshold(0.5), 1u << 31);
}

TEST(Philox, EveryBuildOfTheMaskLoopGivesTheSpecifiedWords) {
  // Each build this CPU runs against philox4x32_10 itself, word by word: lengths around the vector
  // code's groups (8 blocks, 3 groups at a time) and its tails, starts that are not a group
  // apart, and counters whose low word wraps inside a group (the carry into the high word).
  const uint64_t key = 0x9e3779b97f4a7c15ull;
  const uint32_t threshold = dropout_threshold(0.3);
  const float keep = 1.0f / 0.7f;
  int builds = 0;
  for (const MaskBuild build : {MaskBuild::kAvx2, MaskBuild::kBaseline}) {
    if (!mask_build_runs(build)) continue;
    ++builds;
    for (const int64_t first : {int64_t{0}, int64_t{4}, int64_t{4} * 37, (int64_t{1} << 34) - 4 * 21,
                                (int64_t{1} << 34) - 4 * 3, (int64_t{5} << 34) - 4 * 100}) {
      for (const int64_t n : {int64_t{0}, int64_t{3}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{95}, int64_t{96},
                              int64_t{128}, int64_t{129}, int64_t{1000}, int64_t{4099}}) {
        std::vector<float> out(static_cast<size_t>(n), -1.0f);
        dropout_mask_range(key, threshold, keep, out.data(), first, first + n, build);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t b = static_cast<uint64_t>((first + i) / 4);
          const auto w = philox4x32_10({static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 0, 0}, key);
          const float expected = w[(first + i) % 4] < threshold ? 0.0f : keep;
          mismatches += std::memcmp(&out[static_cast<size_t>(i)], &expected, sizeof expected) != 0;
        }
        EXPECT_EQ(mismatches, 0) << "build " << static_cast<int>(build) << ", first " << first << ", n " << n;
      }
    }
  }
  EXPECT_GE(builds, 1);
  // Thresholds at the ends of the word range: nothing dropped, everything but UINT32_MAX dropped.
  for (const MaskBuild build : {MaskBuild::kAvx2, MaskBuild::kBaseline}) {
    if (!mask_build_runs(build)) continue;
    std::vector<float> none(256), all(256);
    dropout_mask_range(key, 0, 2.0f, none.data(), 0, 256, build);
    dropout_mask_range(key, UINT32_MAX, 2.0f, all.data(), 0, 256, build);
    EXPECT_EQ(std::count(none.begin(), none.end(), 2.0f), 256);
    EXPECT_EQ(std::count(all.begin(), all.end(), 0.0f), 256);
  }
}

TEST(Philox, DropoutMaskRangesJoinToTheWholeMask) {
  // Lanes fill ranges of one mask (model/dropout.cpp): any split at a multiple of 4 gives the bits
  // of one call, the vector loop's blocks and the scalar tail falling where they may.
  const uint64_t key = 0xfeedfacecafebeefull;
  const uint32_t threshold = dropout_threshold(0.1);
  for (int64_t n : {int64_t{5}, int64_t{1027}, int64_t{65536 + 9}}) {
    std::vector<float> whole(static_cast<size_t>(n)), parts(static_cast<size_t>(n), -1.0f);
    dropout_mask(key, threshold, 1.25f, whole.data(), n);
    for (int64_t cut : {int64_t{0}, int64_t{4}, n / 2 - (n / 2) % 4, n - n % 4}) {
      std::fill(parts.begin(), parts.end(), -1.0f);
      dropout_mask_range(key, threshold, 1.25f, parts.data(), 0, cut);
      dropout_mask_range(key, threshold, 1.25f, parts.data() + cut, cut, n);
      EXPECT_EQ(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)), 0)
          << "n " << n << " cut " << cut;
    }
  }
  std::vector<float> out(8);
  EXPECT_THROW(dropout_mask_range(key, threshold, 1.0f, out.data(), 2, 8), InvariantError);
}

TEST(Shuffle, FisherYatesIsAPermutationAndSeeded) {
  std::vector<int64_t> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i;
  auto w = v;
  PhiloxStream s1(1), s2(1), s3(2);
  fisher_yates(v, s1);
  auto v2 = w;
  fisher_yates(v2, s2);
  auto v3 = w;
  fisher_yates(v3, s3);
  EXPECT_EQ(v, v2);
  EXPECT_NE(v, v3);
  EXPECT_NE(v, w);
  std::sort(v.begin(), v.end());
  EXPECT_EQ(v, w);
}

}  // namespace
}  // namespace retrace::rng
