#include "data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"

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

}  // namespace
}  // namespace retrace::data
