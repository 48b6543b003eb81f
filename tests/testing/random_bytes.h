// Reproducible bytes for file and digest tests: an xorshift stream seeded by `seed`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace retrace::testing {

inline std::string random_bytes(size_t size, uint64_t seed) {
  std::string bytes(size, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[i] = char(x >> 29);
  }
  return bytes;
}

}  // namespace retrace::testing
