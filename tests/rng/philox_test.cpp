#include "rng/philox.h"

#include <gtest/gtest.h>

#include <algorithm>

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
