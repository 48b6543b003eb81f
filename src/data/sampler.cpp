#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "rng/feistel.h"
#include "rng/shuffle.h"

namespace retrace::data {
namespace {
// Purpose tag of the sampler's Philox key, so other streams keyed by the same seed never collide.
constexpr uint64_t kSamplerPurpose = 0x73616d706c657231ull;  // "sampler1"
}  // namespace

Sampler::Sampler(uint64_t seed, uint64_t num_samples, uint64_t batch_size, LastBatch last_batch, uint32_t rank,
                 uint32_t world_size, Order order)
    : seed_(seed),
      num_samples_(num_samples),
      batch_size_(batch_size),
      last_batch_(last_batch),
      rank_(rank),
      world_size_(world_size),
      order_(order) {
  RETRACE_CHECK(batch_size > 0, ConfigError, "data.batch_size must be at least 1, got 0");
  RETRACE_CHECK(world_size > 0 && rank < world_size, ConfigError, "rank ", rank, " is not below world size ",
                world_size);
  const uint64_t global = batch_size * world_size;
  if (last_batch == LastBatch::kDrop) {
    batches_per_epoch_ = num_samples / global;
    RETRACE_CHECK(batches_per_epoch_ > 0, ConfigError, "the data set has ", num_samples,
                  " samples, fewer than one global batch of ", global,
                  " (data.batch_size x world size); lower data.batch_size or set data.last_batch = \"keep\"");
  } else {
    batches_per_epoch_ = (num_samples + global - 1) / global;
    const uint64_t rest = num_samples % global;
    RETRACE_CHECK(rest == 0 || rest >= world_size, ConfigError, "data.last_batch = \"keep\" leaves a last batch of ",
                  rest, " samples for ", world_size,
                  " ranks, so some ranks would have none; use \"drop\" or a "
                  "batch size that leaves at least one sample per rank");
  }
}

uint64_t Sampler::epoch_key(uint64_t epoch) const { return rng::mix_key(rng::mix_key(seed_, kSamplerPurpose), epoch); }

std::vector<int64_t> Sampler::permutation(uint64_t epoch) const {
  std::vector<int64_t> order(num_samples_);
  if (order_ == Order::kFeistel) {
    const rng::FeistelPermutation f(num_samples_, epoch_key(epoch));
    for (uint64_t p = 0; p < num_samples_; ++p) order[p] = static_cast<int64_t>(f(p));
    return order;
  }
  std::iota(order.begin(), order.end(), int64_t{0});
  rng::PhiloxStream stream(epoch_key(epoch));
  rng::fisher_yates(order, stream);
  return order;
}

uint64_t Sampler::sample_at(uint64_t epoch, uint64_t position) const {
  RETRACE_CHECK(position < num_samples_, InvariantError, "position ", position, " outside the epoch's ", num_samples_,
                " samples");
  if (order_ == Order::kFeistel) return rng::FeistelPermutation(num_samples_, epoch_key(epoch))(position);
  return static_cast<uint64_t>(permutation(epoch)[position]);
}

std::vector<int64_t> Sampler::batch(const Cursor& cursor) {
  RETRACE_CHECK(cursor.batch_in_epoch < batches_per_epoch_, InvariantError, "batch ", cursor.batch_in_epoch,
                " is past the end of the epoch (", batches_per_epoch_, " batches)");
  const uint64_t global = batch_size_ * world_size_;
  const uint64_t begin = cursor.batch_in_epoch * global;
  const uint64_t size = std::min<uint64_t>(global, num_samples_ - begin);
  uint64_t lo, hi;
  if (size == global) {
    lo = begin + rank_ * batch_size_;
    hi = lo + batch_size_;
  } else {
    lo = begin + rank_ * size / world_size_;
    hi = begin + (rank_ + 1) * size / world_size_;
  }
  if (order_ == Order::kFeistel) {
    const rng::FeistelPermutation f(num_samples_, epoch_key(cursor.epoch));
    std::vector<int64_t> out;
    out.reserve(hi - lo);
    for (uint64_t p = lo; p < hi; ++p) out.push_back(static_cast<int64_t>(f(p)));
    return out;
  }
  if (cached_epoch_ != cursor.epoch) {
    cached_ = permutation(cursor.epoch);
    cached_epoch_ = cursor.epoch;
  }
  return std::vector<int64_t>(cached_.begin() + static_cast<std::ptrdiff_t>(lo),
                              cached_.begin() + static_cast<std::ptrdiff_t>(hi));
}

uint64_t Sampler::rank_offset(const Cursor& cursor) const {
  const uint64_t global = batch_size_ * world_size_;
  const uint64_t size = global_batch_samples(cursor);
  return size == global ? rank_ * batch_size_ : rank_ * size / world_size_;
}

uint64_t Sampler::global_batch_samples(const Cursor& cursor) const {
  const uint64_t global = batch_size_ * world_size_;
  const uint64_t begin = cursor.batch_in_epoch * global;
  return std::min<uint64_t>(global, num_samples_ - begin);
}

Cursor Sampler::next(const Cursor& cursor) const {
  if (cursor.batch_in_epoch + 1 < batches_per_epoch_) return {cursor.epoch, cursor.batch_in_epoch + 1};
  return {cursor.epoch + 1, 0};
}

}  // namespace retrace::data
