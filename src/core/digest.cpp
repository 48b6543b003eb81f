#include "core/digest.h"

#include <unistd.h>

#include <endian.h>

#include <cerrno>
#include <cstring>

#include "core/file_util.h"

#include <openssl/evp.h>
#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash exports run-time dispatched XXH3 (SSE2, AVX2, AVX-512 chosen on the CPU it
// runs on): about 2.6x the speed of the plain entry points here, with identical output.
#include <xxh_x86dispatch.h>
#endif

#include <cstdio>
#include <vector>

#include "core/error.h"

namespace retrace {

std::string to_hex(const uint8_t* data, size_t size) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 15];
  }
  return out;
}

std::string Digest128::hex() const {
  uint8_t bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<uint8_t>(hi >> (56 - 8 * i));
    bytes[8 + i] = static_cast<uint8_t>(lo >> (56 - 8 * i));
  }
  return to_hex(bytes, 16);
}

Xxh3::Xxh3() : state_(XXH3_createState()) {
  RETRACE_CHECK(state_ != nullptr, InvariantError, "XXH3_createState failed (out of memory)");
  reset();
}
Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3::reset() { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }
void Xxh3::update(const void* data, size_t size) {
  if (size == 0) return;
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}
void Xxh3::update_u64(uint64_t v) {
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(v >> (8 * i));
  update(le, 8);
}
Digest128 Xxh3::digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Digest128{h.high64, h.low64};
}

Digest128 xxh3_128(const void* data, size_t size) {
  XXH128_hash_t h = XXH3_128bits(data, size);
  return Digest128{h.high64, h.low64};
}
uint64_t xxh3_64(const void* data, size_t size) { return XXH3_64bits(data, size); }

namespace {
// The loop over whole 64-byte blocks: one body, inlined into a 512-bit build where the CPU has
// AVX-512 (GCC otherwise keeps 256-bit vectors: 1.4x here) and into the x86-64 baseline. Integer
// adds, so both give the same sums.
inline __attribute__((always_inline)) void lane_blocks(const unsigned char* p, size_t blocks, uint64_t* a,
                                                       uint64_t* b) {
  uint64_t sa[8], sb[8];
  std::memcpy(sa, a, sizeof sa);
  std::memcpy(sb, b, sizeof sb);
  for (size_t i = 0; i < blocks; ++i) {
    uint64_t w[8];
    std::memcpy(w, p + i * 64, 64);
    for (int l = 0; l < 8; ++l) {
      sa[l] += le64toh(w[l]);
      sb[l] += sa[l];
    }
  }
  std::memcpy(a, sa, sizeof sa);
  std::memcpy(b, sb, sizeof sb);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,prefer-vector-width=512"))) void lane_blocks_avx512(const unsigned char* p,
                                                                                  size_t blocks, uint64_t* a,
                                                                                  uint64_t* b) {
  lane_blocks(p, blocks, a, b);
}
#endif
void lane_blocks_generic(const unsigned char* p, size_t blocks, uint64_t* a, uint64_t* b) {
  lane_blocks(p, blocks, a, b);
}
}  // namespace

Digest128 parse_digest_hex(const std::string& hex, const std::string& where, const char* what) {
  RETRACE_CHECK(hex.size() == 32, FormatError, where, ": ", what, " \"", hex, "\" is not 32 hex digits");
  try {
    return Digest128{std::stoull(hex.substr(0, 16), nullptr, 16), std::stoull(hex.substr(16), nullptr, 16)};
  } catch (const std::logic_error&) {
    RETRACE_FAIL(FormatError, where, ": ", what, " \"", hex, "\" is not hex");
  }
}

void LaneSums::add(const void* data, size_t size) {
  RETRACE_CHECK(!closed_, InvariantError, "LaneSums::add after a piece whose length is not a multiple of 64");
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t words = size / 8, blocks = words / 8;
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) lane_blocks_avx512(p, blocks, a_, b_);
  else lane_blocks_generic(p, blocks, a_, b_);
#else
  lane_blocks_generic(p, blocks, a_, b_);
#endif
  // The words after the whole blocks (lanes 0, 1, ...), then the last bytes as one zero-padded word.
  size_t i = blocks * 8;
  for (; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    a_[i % 8] += le64toh(w);
    b_[i % 8] += a_[i % 8];
  }
  if (size % 8) {
    uint64_t w = 0;
    for (size_t k = 0; k < size % 8; ++k) w |= static_cast<uint64_t>(p[words * 8 + k]) << (8 * k);
    a_[i % 8] += w;
    b_[i % 8] += a_[i % 8];
  }
  closed_ = size % 64 != 0;
}

void LaneSums::finish(uint64_t out[16]) const {
  for (int l = 0; l < 8; ++l) {
    out[l] = a_[l];
    out[8 + l] = b_[l];
  }
}

void lane_sums(const void* data, size_t size, uint64_t out[16]) {
  LaneSums s;
  s.add(data, size);
  s.finish(out);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  RETRACE_CHECK(ctx_ != nullptr, InvariantError, "EVP_MD_CTX_new failed (out of memory)");
  RETRACE_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1,
                InvariantError, "EVP_DigestInit_ex(sha256) failed");
}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(const void* data, size_t size) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
}
std::array<uint8_t, 32> Sha256::finish() {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &len);
  return out;
}
std::string Sha256::finish_hex() {
  auto d = finish();
  return to_hex(d.data(), d.size());
}

std::string sha256_hex(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.finish_hex();
}

std::string sha256_file_hex(const std::string& path) {
  const int fd = fs::open_regular_file(path);
  Sha256 h;
  std::vector<char> buf(1 << 20);
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  RETRACE_CHECK(err == 0, IoError, "read error in ", path, " while computing its sha256: ", fs::errno_text(err));
  return h.finish_hex();
}

}  // namespace retrace
