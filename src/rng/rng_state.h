// RngState: every random stream of a run, captured and restored as one
// value. Streams:
//   - torch's default CPU generator (parameter init, dropout on CPU);
//   - the default generator of every CUDA device (Philox seed and offset), when CUDA is present;
//   - the data cursor (epoch, batch_in_epoch): the sampler's order is a pure function of
//     (seed, epoch), so the cursor is its whole state;
//   - named Philox streams of our own (key, position), e.g. fault injection.
// serialize() gives a versioned little-endian byte string: it is what checkpoints store and what
// the trace digests, so equal bytes mean equal future draws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rng/cursor.h"
#include "rng/philox.h"

namespace retrace::rng {

inline constexpr uint32_t kRngFormatVersion = 1;

struct NamedStream {
  std::string name;
  uint64_t key = 0;
  uint64_t position = 0;
};

struct DeviceGeneratorState {
  int32_t device_index = 0;
  std::string state;  // the generator's get_state() bytes
};

struct RngState {
  uint64_t seed = 0;
  std::string cpu_generator;                  // torch CPU generator get_state() bytes
  std::vector<DeviceGeneratorState> cuda;     // one per visible CUDA device
  Cursor cursor;
  std::vector<NamedStream> streams;           // sorted by name

  std::string serialize() const;
  static RngState deserialize(const std::string& bytes);  // FormatError on malformed input
  bool operator==(const RngState& o) const { return serialize() == o.serialize(); }
};

// Seeds torch's CPU generator and every CUDA generator from `seed` (deterministic per device).
void seed_all(uint64_t seed);
// Seeds torch's CPU generator and, when `cuda_device` >= 0, that CUDA device's: what one device's
// draws need (seed_all seeds every visible device), called before every chunk of a step under
// batch invariance (train/invariant.h); about 1.3 us on the CPU.
void seed_cpu_and_device(uint64_t seed, int cuda_device = -1);
// Captures the torch generators' states; the cursor and named streams are filled by the caller.
RngState capture_torch(uint64_t seed);
// Restores the torch generators' states. Throws ConfigError if the state names CUDA devices that
// this process does not have.
void restore_torch(const RngState& s);

}  // namespace retrace::rng
