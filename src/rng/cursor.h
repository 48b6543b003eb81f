// The data cursor: where a run stands in its data (epoch, batch within the epoch). The sampler's
// order is a pure function of (seed, epoch), so this pair is the whole state of the data order and
// is captured with the other random streams (rng_state.h).
#pragma once

#include <cstdint>

namespace retrace::rng {

struct Cursor {
  uint64_t epoch = 0;
  uint64_t batch_in_epoch = 0;
  bool operator==(const Cursor& o) const { return epoch == o.epoch && batch_in_epoch == o.batch_in_epoch; }
};

}  // namespace retrace::rng
