#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "rng/feistel.h"
#include "rng/philox.h"

namespace retrace::data {
namespace {

TEST(Sampler, EachEpochIsAPermutationAndEpochsDiffer) {
  Sampler s(11, 1000, 32, LastBatch::kDrop);
  auto p0 = s.permutation(0), p1 = s.permutation(1);
  EXPECT_NE(p0, p1);
  auto sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(Sampler(11, 1000, 32, LastBatch::kDrop).permutation(1), p1);
  EXPECT_NE(Sampler(12, 1000, 32, LastBatch::kDrop).permutation(0), p0);
}

TEST(Sampler, ResumesAtAnyCursor) {
  Sampler full(5, 257, 16, LastBatch::kKeep);
  std::vector<std::vector<int64_t>> all;
  Cursor c;
  for (int i = 0; i < 3 * static_cast<int>(full.batches_per_epoch()); ++i) {
    all.push_back(full.batch(c));
    c = full.next(c);
  }
  for (size_t start = 0; start < all.size(); start += 7) {
    Sampler resumed(5, 257, 16, LastBatch::kKeep);
    Cursor rc{start / full.batches_per_epoch(), start % full.batches_per_epoch()};
    for (size_t i = start; i < all.size(); ++i) {
      ASSERT_EQ(resumed.batch(rc), all[i]) << "resumed at " << start << ", batch " << i;
      rc = resumed.next(rc);
    }
  }
}

TEST(Sampler, RankShardsPartitionEachEpoch) {
  for (LastBatch lb : {LastBatch::kDrop, LastBatch::kKeep}) {
    const uint32_t world = 4;
    std::vector<Sampler> ranks;
    for (uint32_t r = 0; r < world; ++r) ranks.emplace_back(9, 1005, 10, lb, r, world);
    std::multiset<int64_t> seen;
    for (uint64_t b = 0; b < ranks[0].batches_per_epoch(); ++b)
      for (auto& s : ranks)
        for (int64_t i : s.batch({0, b})) seen.insert(i);
    const size_t expected = lb == LastBatch::kDrop ? 1000 : 1005;
    EXPECT_EQ(seen.size(), expected);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), expected) << "shards overlap";
  }
}

TEST(Sampler, DropAndKeepBatchCounts) {
  EXPECT_EQ(Sampler(1, 60000, 128, LastBatch::kDrop).batches_per_epoch(), 468u);
  Sampler keep(1, 60000, 128, LastBatch::kKeep);
  EXPECT_EQ(keep.batches_per_epoch(), 469u);
  EXPECT_EQ(keep.batch({0, 468}).size(), 60000u - 468u * 128u);
}

TEST(Sampler, RejectsImpossibleSettings) {
  EXPECT_THROW(Sampler(1, 10, 0, LastBatch::kDrop), ConfigError);
  EXPECT_THROW(Sampler(1, 10, 32, LastBatch::kDrop), ConfigError);
  EXPECT_THROW(Sampler(1, 10, 2, LastBatch::kDrop, 2, 2), ConfigError);
  // keep: 17 samples in global batches of 16 leave 1 sample for 4 ranks.
  EXPECT_THROW(Sampler(1, 17, 4, LastBatch::kKeep, 0, 4), ConfigError);
  EXPECT_NO_THROW(Sampler(1, 20, 4, LastBatch::kKeep, 0, 4));
}

// Whether f is a bijection of [0, n): every image in range, none twice.
template <typename F>
::testing::AssertionResult is_permutation_of(uint64_t n, const F& f) {
  std::vector<bool> seen(n, false);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t x = f(i);
    if (x >= n) return ::testing::AssertionFailure() << "n " << n << ": image " << x << " of " << i << " out of range";
    if (seen[x]) return ::testing::AssertionFailure() << "n " << n << ": " << x << " twice";
    seen[x] = true;
  }
  return ::testing::AssertionSuccess();
}

TEST(Feistel, IsAPermutationAtEveryWidthAndEdge) {
  // Both sides of the powers of two, where the bit width m (and the halves' widths) change.
  std::vector<uint64_t> sizes{1, 2, 3, 4, 5, 1000};
  for (uint64_t k = 3; k <= 16; ++k)
    for (uint64_t n : {(uint64_t{1} << k) - 1, uint64_t{1} << k, (uint64_t{1} << k) + 1}) sizes.push_back(n);
  for (uint64_t n : sizes)
    for (uint64_t key : {uint64_t{0}, uint64_t{0x1234}, ~uint64_t{0}})
      EXPECT_TRUE(is_permutation_of(n, rng::FeistelPermutation(n, key))) << "key " << key;
  EXPECT_EQ(rng::FeistelPermutation(0, 1).n(), 0u);
  EXPECT_THROW(rng::FeistelPermutation(0, 1)(0), InvariantError);
  EXPECT_THROW(rng::FeistelPermutation(10, 1)(10), InvariantError);
  EXPECT_EQ(rng::FeistelPermutation(1, 99)(0), 0u);
  // n = 2: both orders occur over keys (the network is not stuck on one).
  std::set<uint64_t> firsts;
  for (uint64_t key = 0; key < 64; ++key) firsts.insert(rng::FeistelPermutation(2, key)(0));
  EXPECT_EQ(firsts, (std::set<uint64_t>{0, 1}));
}

TEST(Feistel, LargeSizesStayInRangeAndDistinct) {
  // Around 2^32 (halves of 16 and 17 bits), 2^40 and the largest widths (m = 64: halves of 32).
  for (uint64_t n : {(uint64_t{1} << 32) - 1, uint64_t{1} << 32, (uint64_t{1} << 32) + 1, uint64_t{1} << 40,
                     (uint64_t{1} << 63) + 1, ~uint64_t{0}}) {
    const rng::FeistelPermutation f(n, 77);
    std::set<uint64_t> images;
    for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{2}, n / 3, n / 2, n - 2, n - 1}) {
      const uint64_t x = f(i);
      EXPECT_LT(x, n) << "n " << n << ", i " << i;
      images.insert(x);
    }
    EXPECT_EQ(images.size(), 7u) << "n " << n;
  }
}

TEST(Feistel, ValuesArePinned) {
  // The order is part of every recorded run with data.order = "feistel": a change of the function
  // (rounds, round function, counter, packing, cycle walk) must show up here, not in users' replays.
  const rng::FeistelPermutation f(1000, rng::mix_key(rng::mix_key(1234, 0x73616d706c657231ull), 0));
  std::vector<uint64_t> got;
  for (uint64_t i = 0; i < 6; ++i) got.push_back(f(i));
  EXPECT_EQ(got, (std::vector<uint64_t>{661, 866, 173, 743, 494, 396}));
  const rng::FeistelPermutation five(5, 42);
  got.clear();
  for (uint64_t i = 0; i < 5; ++i) got.push_back(five(i));
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 4, 3, 2, 0}));
  const rng::FeistelPermutation big(uint64_t{10000000000}, 7);
  EXPECT_EQ(big(0), 7083145123u);
  EXPECT_EQ(big(9999999999), 5677824042u);
  const rng::FeistelPermutation widest(~uint64_t{0}, 5);
  EXPECT_EQ(widest(0), 1404544864547879595u);
  EXPECT_EQ(widest(~uint64_t{0} - 1), 12336690998724672146u);
}

TEST(Sampler, FeistelOrderHoldsNothingOfTheDataSize) {
  // 10^12 windows (a trillion tokens at context 1023): a batch is computed from its own positions
  // (an epoch's permutation would be 8 TB and 10^12 steps: this test could not finish), in range,
  // distinct; the sampler holds no heap memory at all, at 10^12 as at 10^3, and its size is fixed.
  const uint64_t n = 1000000000000ull;
  Sampler s(3, n, 64, LastBatch::kDrop, 1, 8, Order::kFeistel);
  EXPECT_EQ(s.batches_per_epoch(), n / 512);
  const std::vector<int64_t> b = s.batch({5, s.batches_per_epoch() - 1});
  ASSERT_EQ(b.size(), 64u);
  std::set<int64_t> distinct(b.begin(), b.end());
  EXPECT_EQ(distinct.size(), 64u);
  for (int64_t x : b) EXPECT_LT(static_cast<uint64_t>(x), n);
  EXPECT_EQ(static_cast<uint64_t>(b[3]), s.sample_at(5, (s.batches_per_epoch() - 1) * 512 + 64 + 3));
  EXPECT_THROW(s.sample_at(0, n), InvariantError);
  EXPECT_EQ(s.held_bytes(), 0u);
  // The same batch from a sampler of the same run at any other point: resume is O(1).
  Sampler fresh(3, n, 64, LastBatch::kDrop, 1, 8, Order::kFeistel);
  EXPECT_EQ(fresh.batch({5, s.batches_per_epoch() - 1}), b);
  Sampler small(3, 1000, 64, LastBatch::kDrop, 1, 8, Order::kFeistel);
  small.batch({0, 0});
  EXPECT_EQ(small.held_bytes(), 0u);
  static_assert(sizeof(Sampler) <= 128, "a sampler is a few words and one empty vector");
  // The shuffle order holds its epoch: 8 bytes per sample.
  Sampler shuffle(3, 1000, 64, LastBatch::kDrop, 1, 8, Order::kShuffle);
  shuffle.batch({0, 0});
  EXPECT_EQ(shuffle.held_bytes(), 8000u);
}

TEST(Sampler, ShuffleOrderIsTheRecordedOneAndFeistelAnother) {
  Sampler shuffle(11, 1000, 32, LastBatch::kDrop);  // the default argument: the legacy order
  Sampler explicit_shuffle(11, 1000, 32, LastBatch::kDrop, 0, 1, Order::kShuffle);
  Sampler feistel(11, 1000, 32, LastBatch::kDrop, 0, 1, Order::kFeistel);
  // Runs recorded before data.order existed read "shuffle": its values are those of then.
  const std::vector<int64_t> p0 = shuffle.permutation(0);
  EXPECT_EQ(std::vector<int64_t>(p0.begin(), p0.begin() + 6), (std::vector<int64_t>{168, 950, 467, 281, 152, 146}));
  const std::vector<int64_t> b = shuffle.batch({3, 7});
  EXPECT_EQ(b.front(), 921);
  EXPECT_EQ(b.back(), 345);
  EXPECT_EQ(shuffle.sample_at(0, 1), 950u);
  EXPECT_EQ(p0, explicit_shuffle.permutation(0));
  EXPECT_NE(p0, feistel.permutation(0));
  const std::vector<int64_t> epoch2 = feistel.permutation(2);
  EXPECT_EQ(feistel.batch({2, 3}), std::vector<int64_t>(epoch2.begin() + 96, epoch2.begin() + 128));
  for (uint64_t p = 0; p < 1000; p += 37) EXPECT_EQ(feistel.sample_at(2, p), static_cast<uint64_t>(epoch2[p]));
  EXPECT_NE(feistel.permutation(0), feistel.permutation(1));
  EXPECT_EQ(Sampler(11, 1000, 32, LastBatch::kDrop, 0, 1, Order::kFeistel).permutation(1), feistel.permutation(1));
  // The key is the shuffle's: mix_key(mix_key(seed, "sampler1"), epoch).
  const rng::FeistelPermutation f(1000, rng::mix_key(rng::mix_key(11, 0x73616d706c657231ull), 2));
  EXPECT_EQ(feistel.sample_at(2, 5), f(5));
}

}  // namespace
}  // namespace retrace::data
