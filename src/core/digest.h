// Digests: xxh3-128 for per-step content digests (fast, not cryptographic), sha256 for integrity
// of files on disk (checkpoint shards). Both are streaming and deterministic across machines.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/file_util.h"

namespace retrace {

// A 128-bit digest, stored as (high, low) like XXH128_hash_t.
struct Digest128 {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const Digest128& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const Digest128& o) const { return !(*this == o); }
  std::string hex() const;  // 32 lowercase hex digits, hi first
};

// Streaming xxh3-128. Not thread-safe; one per thread.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void reset();
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Fixed-width little-endian scalars, so the digest does not depend on the host's byte order.
  void update_u64(uint64_t v);
  void update_digest(const Digest128& d) {
    update_u64(d.hi);
    update_u64(d.lo);
  }
  Digest128 digest() const;

 private:
  void* state_;
};

Digest128 xxh3_128(const void* data, size_t size);
// Digest128::hex() read back; FormatError "WHERE: WHAT \"HEX\" is not 32 hex digits" (or "is not
// hex") otherwise.
Digest128 parse_digest_hex(const std::string& hex, const std::string& where, const char* what = "digest");
// Lane checksums of `size` bytes read as little-endian 64-bit words, word i into lane i % 8: per
// lane the sum of its words (out[l]) and the sum of those running sums (out[8 + l]), modulo 2^64;
// the last size % 8 bytes form one more word, zero-padded. Integer arithmetic, so equal bytes give
// equal sums on every machine and vector width; about twice xxh3's speed here (a memory-speed
// checksum of large state: any one changed word, and any two, change the sums).
void lane_sums(const void* data, size_t size, uint64_t out[16]);

// Position-mixed sums, the digest of a tensor that adds up over slices (sharded state: each rank
// sums its ranges, the sums of all ranks add to the whole tensor's). Element p (its global flat
// position in the tensor) with bytes zero-extended to the 64-bit word w contributes
// mix_position_word(p, w) = fmix64(w + (p + 1) * 0x9E3779B97F4A7C15), murmur3's finalizer, a
// bijection of 64-bit words; the digest is the sum of the contributions modulo 2^64. Integer
// arithmetic: exact, the same in any summation order, on any machine and device (torch's int64
// ops compute the same, tensor_digest.h). Unlike a plain sum or XOR of the words it sees a swap
// of two unequal elements and a pair of changes that cancel in the words' sum, since each
// contribution is a non-linear function of both the position and the word.
inline constexpr uint64_t kPositionPhi = 0x9E3779B97F4A7C15ull;
inline uint64_t fmix64(uint64_t z) {
  z ^= z >> 33;
  z *= 0xFF51AFD7ED558CCDull;
  z ^= z >> 33;
  z *= 0xC4CEB9FE1A85EC53ull;
  z ^= z >> 33;
  return z;
}
inline uint64_t mix_position_word(uint64_t position, uint64_t word) {
  return fmix64(word + (position + 1) * kPositionPhi);
}
// trace.digest_version 4's mix, at about a third of fmix64's cost: x = w + (p + 1) * phi as above,
// then lo(x) * hi(x) + x, lo and hi its 32-bit halves, one 32 x 32 -> 64-bit multiply (a single
// vector instruction, where fmix64 needs two 64-bit ones). Still exact integer arithmetic that adds
// up over slices. Unlike fmix64 it is not a bijection, so a change can go unseen, but only by a
// coincidence of the product terms (about 2^-32 for a random change): for a word of up to 32 bits
// the contribution is (lo + 2^32)(hi + 1) - 2^32, strictly increasing in the word while hi stays;
// a swap of two unequal words, or a pair of changes that cancel in the words' sum, moves the
// product terms by about (w1 - w2)(hi1 - hi2) (the positions' high halves differ), where a plain
// sum or XOR of the words does not change at all. Digest.* tests both.
inline uint64_t mix_halves(uint64_t position, uint64_t word) {
  const uint64_t x = word + (position + 1) * kPositionPhi;
  return (x & 0xffffffffull) * (x >> 32) + x;
}
// Which mix a mixed sum uses: version 3's fmix64, or version 4's halves.
enum class Mix : uint8_t { kFmix64 = 3, kHalves = 4 };
// The sum of mix_position_word over `count` elements of `element_size` bytes (1, 2, 4 or 8,
// little-endian) at `data`, the first at global position `first_position`. InvariantError for
// another element size.
// On a CPU with AVX-512 DQ a build of the loop with 64-bit vector multiplies runs (about 4x the
// baseline's speed here); mixed_sum_baseline is the x86-64 baseline build, which a test holds
// the vector build equal to.
uint64_t mixed_sum(const void* data, size_t element_size, uint64_t count, uint64_t first_position,
                   Mix mix = Mix::kFmix64);
uint64_t mixed_sum_baseline(const void* data, size_t element_size, uint64_t count, uint64_t first_position,
                            Mix mix = Mix::kFmix64);

// lane_sums of consecutive pieces of one byte string, fed piece by piece (the fused AdamW sums
// what it writes, chunk by chunk): every piece but the last must be a multiple of 64 bytes.
class LaneSums {
 public:
  void add(const void* data, size_t size);  // InvariantError after a piece that was not
  // The sums of this string followed by `next`'s, as if next's pieces had been added here: lanes
  // of one string summed in parts on several threads. This string must be whole 64-byte blocks
  // (InvariantError otherwise); `next` may end in a partial one.
  void append(const LaneSums& next);
  void finish(uint64_t out[16]) const;

 private:
  uint64_t a_[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b_[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint64_t words_ = 0;   // words summed so far, the zero-padded last one included
  bool closed_ = false;  // a piece of a length that is not a multiple of 64 came
};
uint64_t xxh3_64(const void* data, size_t size);

// Streaming sha256 (OpenSSL EVP).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> finish();
  std::string finish_hex();

 private:
  void* ctx_;
};

std::string sha256_hex(const void* data, size_t size);
// sha256 of a whole file in one pass: a second thread hashes each 4 MiB block as soon as it has
// been read, so the reads and the hashing overlap. Throws IoError if it cannot be read.
std::string sha256_file_hex(const std::string& path, fs::Links links = fs::Links::kFollow);
// A whole file and the sha256 of exactly those bytes, in the same single pass (the bytes that are
// hashed are the bytes returned). FormatError when the file is larger than max_bytes, IoError when
// it cannot be read; a file that ends early returns what was there (the caller checks the size).
struct HashedFile {
  fs::FileBytes bytes;
  std::string sha256;  // lowercase hex
};
HashedFile read_file_sha256(const std::string& path, uint64_t max_bytes, fs::Links links = fs::Links::kFollow);
// The same single pass, the bytes read straight to where the caller keeps them: the bytes of each
// segment (in file order, not overlapping) land at its `dest`; the bytes no segment covers go
// through a small ring and are only hashed. Returns the sha256 (hex) of every byte read; `got`
// says how many were read (fewer than the file's size only when it ended early). The same errors
// as read_file_sha256. The destinations hold the bytes once it returns; until then they are being
// written (and are hashed where they lie).
struct FileSegment {
  uint64_t offset = 0;
  uint64_t size = 0;
  char* dest = nullptr;
};
std::string read_file_sha256_into(const std::string& path, uint64_t max_bytes, const std::vector<FileSegment>& segments,
                                  uint64_t& got, fs::Links links = fs::Links::kFollow);
std::string to_hex(const uint8_t* data, size_t size);

}  // namespace retrace
