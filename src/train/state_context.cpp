#include "train/state_context.h"

#include <utility>

#include "core/error.h"
#include "train/optimizer.h"
#include "train/zero.h"

namespace retrace::train {

uint64_t rank_seed(uint64_t seed, uint32_t rank) {
  if (rank == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  // torch's CPU generator takes any 64-bit seed; keep it within the config's range for messages.
  return (z ^ (z >> 31)) & ((1ull << 53) - 1);
}

NamedTensors optimizer_state_of(TrainState& s, const StateContext& c, std::vector<SliceOf>* slices) {
  if (slices) slices->clear();
  if (!s.zero) return optimizer_state(*s.optimizer, *s.model.module, c.optimizer);
  std::vector<SliceOf> mine;
  NamedTensors out = zero_optimizer_state(*s.optimizer, *s.zero, *s.model.module, c.optimizer, mine);
  if (slices) *slices = std::move(mine);
  return out;
}

void load_optimizer_state_of(TrainState& s, const StateContext& c, const NamedTensors& state, bool adopt) {
  if (s.zero) return zero_load_optimizer_state(*s.optimizer, *s.zero, *s.model.module, c.optimizer, state);
  load_optimizer_state(*s.optimizer, *s.model.module, c.optimizer, state, adopt);
}

void restore_position(TrainState& s, const StateContext& c, uint64_t step, const rng::RngState& rng,
                      uint64_t samples_seen) {
  RETRACE_CHECK(rng.cursor.batch_in_epoch < c.batches_per_epoch, FormatError, "the checkpoint's data cursor (epoch ",
                rng.cursor.epoch, ", batch ", rng.cursor.batch_in_epoch, ") is past the end of an epoch of ",
                c.batches_per_epoch, " batches: was it made with another batch size?");
  RETRACE_CHECK(step <= (uint64_t(1) << 40) && samples_seen <= step * c.samples_per_step, FormatError,
                "the checkpoint of step ", step, " says ", samples_seen, " samples were seen, more than ", step,
                " steps of ", c.samples_per_step, " can see; its state was edited or belongs to another config");
  s.step = step;
  s.samples_seen = samples_seen;
  s.cursor = rng.cursor;
  rng::restore_torch(rng, c.cuda_device);
}

}  // namespace retrace::train
