// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator retrace uses for all of its own draws. A draw is a pure function of
// (key, counter), so a stream is fully described by two numbers and can be restored or recomputed
// at any point without replaying earlier draws. The output is specified bit for bit and does not
// depend on the compiler or standard library.
#pragma once

#include <array>
#include <cstdint>

namespace retrace::rng {

using PhiloxBlock = std::array<uint32_t, 4>;

// One Philox4x32 block for a 128-bit counter and a 64-bit key (ten rounds).
PhiloxBlock philox4x32_10(PhiloxBlock counter, uint64_t key);

// A stream of 64-bit values: value i is built from block i / 2 of the counter sequence.
// State = (key, position); two streams with equal state produce equal values.
class PhiloxStream {
 public:
  PhiloxStream() = default;
  PhiloxStream(uint64_t key, uint64_t position = 0) : key_(key), position_(position) {}

  uint64_t next_u64();
  // Uniform integer in [0, bound), bound > 0: Lemire's multiply-shift with rejection, so the
  // result is exactly uniform and the number of values consumed is specified by this algorithm.
  uint64_t next_below(uint64_t bound);

  uint64_t key() const { return key_; }
  uint64_t position() const { return position_; }

 private:
  uint64_t key_ = 0;
  uint64_t position_ = 0;  // index of the next 64-bit value
};

// A dropout mask from one Philox4x32-10 key: element i is 0 when word i % 4 of block i / 4 (the
// block for counter {i/4 low 32 bits, i/4 high 32 bits, 0, 0}) is below drop_threshold, and
// keep_scale otherwise. Words are uniform on [0, 2^32), so an element is dropped with probability
// drop_threshold / 2^32 (see dropout_threshold). Integer-only: the same on every CPU and build.
void dropout_mask(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t n);
// The builds of the mask's loop: hand-written AVX2 code and the x86-64 baseline. Both give the
// same words (integer operations only); kFastest picks AVX2 where the CPU has it. Tests ask for
// each in turn.
enum class MaskBuild { kFastest, kAvx2, kBaseline };
// Whether this CPU runs `build` (kFastest and kBaseline: always).
bool mask_build_runs(MaskBuild build);
// Elements [begin, end) of the same mask into out[0, end - begin): a mask is a function of the
// element index, so lanes that fill ranges of one mask give the bits of one dropout_mask call.
// begin must be a multiple of 4, and `build` one this CPU runs (InvariantError otherwise).
void dropout_mask_range(uint64_t key, uint32_t drop_threshold, float keep_scale, float* out, int64_t begin, int64_t end,
                        MaskBuild build = MaskBuild::kFastest);
// floor(p * 2^32) for 0 <= p < 1.
uint32_t dropout_threshold(double p);

// Mixes coordinates (seed, purpose, epoch, rank, ...) into one 64-bit key (splitmix64 finalizer
// applied in sequence). Specified here so keys are the same everywhere.
uint64_t mix_key(uint64_t a, uint64_t b);

}  // namespace retrace::rng
