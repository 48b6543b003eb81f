// RngState: every random stream of a run, captured and restored as one
// value. Streams:
//   - torch's default CPU generator (parameter init, dropout on CPU);
//   - on a CUDA run, the default generator of the run's own device (Philox seed and offset); a CPU
//     run records the CPU generator alone, so it resumes on any machine, with or without GPUs;
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
// Version 2: version 1 followed by the other generators (RngState::generators), written only when there are any.
inline constexpr uint32_t kRngFormatVersionGenerators = 2;

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
  std::string cpu_generator;               // torch CPU generator get_state() bytes
  std::vector<DeviceGeneratorState> cuda;  // the run's CUDA device; empty on a CPU run
  Cursor cursor;
  std::vector<NamedStream> streams;  // sorted by name
  // Generators outside torch and retrace, as opaque states by name (a Python loop's "python.random"
  // and "numpy.global"), sorted by name. Written as format version 2, only when there are any:
  // every other state keeps version 1's bytes.
  std::vector<std::pair<std::string, std::string>> generators;

  std::string serialize() const;
  static RngState deserialize(const std::string& bytes);  // FormatError on malformed input
  bool operator==(const RngState& o) const { return serialize() == o.serialize(); }
};

// `cuda_device` below is the run's CUDA device index, -1 on a CPU run (train::cuda_index).
// Seeds torch's CPU generator and, when `cuda_device` >= 0, that CUDA device's generator; also
// called before every chunk of a step under batch invariance (train/invariant.h), about 1.3 us.
void seed_cpu_and_device(uint64_t seed, int cuda_device);
// Captures the CPU generator and the run's CUDA generator; the cursor and named streams are filled
// by the caller.
RngState capture_torch(uint64_t seed, int cuda_device);
// Restores the CPU generator and, on a CUDA run, the run's CUDA generator (recorded under the
// same index, or the only one recorded: a rank may get another index on another host).
// ConfigError when a CUDA run's state holds no CUDA generator. A CPU run ignores CUDA entries
// (traces of older versions recorded every visible GPU's). FormatError, nothing restored, when a
// generator state has another size than this LibTorch's (check_restorable).
void restore_torch(const RngState& s, int cuda_device);
// That restore_torch(s, cuda_device) can take s: the CPU generator's state (and the device's, on
// CUDA) has exactly the size this LibTorch's generator gives (FormatError naming `where` and both
// sizes otherwise, where set_state would fail inside LibTorch).
void check_restorable(const RngState& s, int cuda_device, const std::string& where);

}  // namespace retrace::rng
