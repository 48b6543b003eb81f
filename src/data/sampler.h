// The deterministic sampler. The order of epoch e is a pure function of (seed, e), by Order:
//   kFeistel  position p of epoch e holds sample FeistelPermutation(n, key)(p) (rng/feistel.h),
//             computed for the batch's positions only: no permutation is held, so memory and the
//             cost of a batch or a resume do not grow with n;
//   kShuffle  a Fisher-Yates shuffle of [0, n) driven by a Philox stream (rng/shuffle.h), held
//             for the cursor's epoch (8 bytes per sample): the order of runs recorded before
//             data.order existed.
// Both key the epoch by key = mix_key(mix_key(seed, "sampler1"), epoch). A position in the data
// is a Cursor (epoch, batch_in_epoch); resuming needs nothing else.
//
// Batches: the global batch is batch_size * world_size samples; rank r takes the r-th contiguous
// slice of batch_size samples, so the ranks' shards are disjoint and together cover the batch.
// Last partial batch (n not a multiple of the global batch), by LastBatch:
//   kDrop: the remainder is not used in that epoch (a different remainder each epoch, since the
//          order changes). Every step has exactly batch_size samples per rank. The default.
//   kKeep: one smaller final global batch of m samples; rank r takes samples
//          [r*m/W, (r+1)*m/W) of it (integer division), so ranks may differ by one sample. A last
//          batch with fewer samples than ranks is refused (ConfigError): a rank would have none.
#pragma once

#include <cstdint>
#include <vector>

#include "rng/cursor.h"

namespace retrace::data {

enum class LastBatch : uint8_t { kDrop, kKeep };    // data.last_batch: "drop" | "keep"
enum class Order : uint8_t { kFeistel, kShuffle };  // data.order: "feistel" | "shuffle"

// The position in the data (rng/cursor.h): the sampler's whole state.
using Cursor = rng::Cursor;

class Sampler {
 public:
  // Throws ConfigError if batch_size or world_size is 0, rank >= world_size, the data set is
  // smaller than one global batch under kDrop, or kKeep leaves a rank without samples.
  Sampler(uint64_t seed, uint64_t num_samples, uint64_t batch_size, LastBatch last_batch, uint32_t rank = 0,
          uint32_t world_size = 1, Order order = Order::kShuffle);

  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  // The permutation of epoch `epoch` (a pure function of seed and epoch), whole: for tests and
  // small data sets; batch() never builds it under kFeistel.
  std::vector<int64_t> permutation(uint64_t epoch) const;
  // The sample at `position` (< num_samples, InvariantError otherwise) of epoch `epoch`: O(1)
  // under kFeistel; kShuffle builds the epoch's permutation (O(n), for tests).
  uint64_t sample_at(uint64_t epoch, uint64_t position) const;
  // This rank's sample indices at `cursor` (kShuffle: from a cached permutation of its epoch;
  // kFeistel: only the batch's positions are computed).
  std::vector<int64_t> batch(const Cursor& cursor);
  // Samples of the whole global batch at `cursor` over all ranks.
  uint64_t global_batch_samples(const Cursor& cursor) const;
  // Where this rank's samples start within the global batch at `cursor`.
  uint64_t rank_offset(const Cursor& cursor) const;
  // The cursor after `cursor` (rolls over to the next epoch).
  Cursor next(const Cursor& cursor) const;

  uint64_t seed() const { return seed_; }
  Order order() const { return order_; }
  uint64_t num_samples() const { return num_samples_; }
  // Heap bytes the sampler holds besides its own sizeof: 0 under kFeistel whatever n is; under
  // kShuffle the cached permutation of the last batch's epoch (8 bytes per sample) once batch() ran.
  uint64_t held_bytes() const { return cached_.capacity() * sizeof(int64_t); }

 private:
  uint64_t epoch_key(uint64_t epoch) const;

  uint64_t seed_;
  uint64_t num_samples_;
  uint64_t batch_size_;
  LastBatch last_batch_;
  uint32_t rank_;
  uint32_t world_size_;
  uint64_t batches_per_epoch_;
  Order order_ = Order::kShuffle;
  uint64_t cached_epoch_ = UINT64_MAX;
  std::vector<int64_t> cached_;
};

}  // namespace retrace::data
