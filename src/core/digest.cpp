#include "core/digest.h"

#include <fcntl.h>
#include <unistd.h>

#include <endian.h>

#include <cerrno>
#include <cstring>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "core/cpu_isa.h"
#include "core/file_util.h"
#include "core/hash_ahead.h"

#include <openssl/evp.h>
#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash exports run-time dispatched XXH3 (SSE2, AVX2, AVX-512 chosen on the CPU it
// runs on): about 2.6x the speed of the plain entry points here, with identical output.
#include <xxh_x86dispatch.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
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
  RETRACE_CHECK(hex.size() == 32 && hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos, FormatError,
                where, ": ", what, " \"", hex.substr(0, 64), "\" is not 32 hex digits");
  uint64_t half[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    const uint64_t d = c <= '9' ? uint64_t(c - '0') : c <= 'F' ? uint64_t(c - 'A' + 10) : uint64_t(c - 'a' + 10);
    half[i / 16] = half[i / 16] << 4 | d;
  }
  return Digest128{half[0], half[1]};
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
  words_ += (size + 7) / 8;
  closed_ = size % 64 != 0;
}

void LaneSums::append(const LaneSums& next) {
  RETRACE_CHECK(!closed_ && words_ % 8 == 0, InvariantError,
                "LaneSums::append after a piece whose length is not a multiple of 64");
  // Every running sum of next's lane l starts from this string's a_[l]: b gains a_[l] once per
  // word next puts in lane l (words_ % 8 == 0, so next's word i lands in lane i % 8 here too).
  for (int l = 0; l < 8; ++l) {
    const uint64_t count = next.words_ / 8 + (static_cast<uint64_t>(l) < next.words_ % 8 ? 1 : 0);
    b_[l] += next.b_[l] + count * a_[l];
    a_[l] += next.a_[l];
  }
  words_ += next.words_;
  closed_ = next.closed_;
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

namespace {
// The sum over `count` words of one width. Integer arithmetic, so every build of it (the baseline
// and the AVX-512 one, whose 64-bit vector multiplies let the compiler take 8 elements at a time)
// gives the same sum.
// The position's term (p + 1) * phi is carried from element to element by adding phi (the same
// value modulo 2^64), so the vector build needs no multiply for it: two per element, not three.
template <typename Word, Mix kMix>
__attribute__((always_inline)) inline uint64_t mixed_words(const unsigned char* p, uint64_t count,
                                                           uint64_t first_position) {
  uint64_t sum = 0;
  uint64_t position_term = (first_position + 1) * kPositionPhi;
  for (uint64_t i = 0; i < count; ++i) {
    Word w;
    std::memcpy(&w, p + i * sizeof(Word), sizeof(Word));
    const uint64_t x = static_cast<uint64_t>(w) + position_term;
    if constexpr (kMix == Mix::kFmix64) sum += fmix64(x);
    else  // written as a widening 32 x 32 -> 64 multiply, so the vector build uses vpmuludq
      sum += static_cast<uint64_t>(static_cast<uint32_t>(x)) * static_cast<uint64_t>(static_cast<uint32_t>(x >> 32)) +
             x;
    position_term += kPositionPhi;
  }
  return sum;
}

template <Mix kMix>
__attribute__((always_inline)) inline uint64_t words_of_size(const unsigned char* p, size_t element_size,
                                                             uint64_t count, uint64_t first) {
  switch (element_size) {
    case 1: return mixed_words<uint8_t, kMix>(p, count, first);
    case 2: return mixed_words<uint16_t, kMix>(p, count, first);
    case 4: return mixed_words<uint32_t, kMix>(p, count, first);
    default: return mixed_words<uint64_t, kMix>(p, count, first);
  }
}

uint64_t baseline_words(const unsigned char* p, size_t element_size, uint64_t count, uint64_t first, Mix mix) {
  return mix == Mix::kHalves ? words_of_size<Mix::kHalves>(p, element_size, count, first)
                             : words_of_size<Mix::kFmix64>(p, element_size, count, first);
}

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns that its own _mm512_undefined_epi32 (__Y, in avx512fintrin.h) "may be used
// uninitialized" where _mm512_reduce_add_epi64 and the conversions inline it: a false positive of
// the compiler's header (GCC bug 105593), not of this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Version 4's mix of 4-byte words, 16 at a time: the compiler writes lo(x) * hi(x) with 64-bit
// multiplies (vpmullq), where one 32 x 32 -> 64 multiply of the lanes' low halves (vpmuludq) is
// all it needs. The same sum as the template's, element by element (a test holds them equal).
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))) uint64_t halves_words32_avx512(const unsigned char* p,
                                                                                             uint64_t count,
                                                                                             uint64_t first) {
  alignas(64) uint64_t start[8];
  for (int l = 0; l < 8; ++l) start[l] = (first + 1 + static_cast<uint64_t>(l)) * kPositionPhi;
  __m512i pos_a = _mm512_load_si512(start);
  const __m512i eight = _mm512_set1_epi64(static_cast<long long>(8 * kPositionPhi));
  const __m512i sixteen = _mm512_set1_epi64(static_cast<long long>(16 * kPositionPhi));
  __m512i pos_b = _mm512_add_epi64(pos_a, eight);
  __m512i sum_a = _mm512_setzero_si512(), sum_b = _mm512_setzero_si512();
  uint64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i wa = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i)));
    const __m512i wb = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 4 * i + 32)));
    const __m512i xa = _mm512_add_epi64(wa, pos_a), xb = _mm512_add_epi64(wb, pos_b);
    sum_a = _mm512_add_epi64(sum_a, _mm512_add_epi64(_mm512_mul_epu32(xa, _mm512_srli_epi64(xa, 32)), xa));
    sum_b = _mm512_add_epi64(sum_b, _mm512_add_epi64(_mm512_mul_epu32(xb, _mm512_srli_epi64(xb, 32)), xb));
    pos_a = _mm512_add_epi64(pos_a, sixteen);
    pos_b = _mm512_add_epi64(pos_b, sixteen);
  }
  uint64_t sum = static_cast<uint64_t>(_mm512_reduce_add_epi64(_mm512_add_epi64(sum_a, sum_b)));
  return sum + mixed_words<uint32_t, Mix::kHalves>(p + 4 * i, count - i, first + i);
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))) uint64_t mixed_sum_avx512(const unsigned char* p,
                                                                                        size_t element_size,
                                                                                        uint64_t count, uint64_t first,
                                                                                        Mix mix) {
  if (mix == Mix::kHalves && element_size == 4) return halves_words32_avx512(p, count, first);
  return mix == Mix::kHalves ? words_of_size<Mix::kHalves>(p, element_size, count, first)
                             : words_of_size<Mix::kFmix64>(p, element_size, count, first);
}
#pragma GCC diagnostic pop
#endif

void check_mixed_args(size_t element_size, Mix mix) {
  RETRACE_CHECK(element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8, InvariantError,
                "mixed_sum: element size ", element_size, " is not 1, 2, 4 or 8");
  RETRACE_CHECK(mix == Mix::kFmix64 || mix == Mix::kHalves, InvariantError, "mixed_sum: mix ", int(mix));
}
}  // namespace

uint64_t mixed_sum(const void* data, size_t element_size, uint64_t count, uint64_t first_position, Mix mix) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "mixed_sum reads little-endian elements natively");
  check_mixed_args(element_size, mix);
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx512dq()) return mixed_sum_avx512(p, element_size, count, first_position, mix);
#endif
  return baseline_words(p, element_size, count, first_position, mix);
}

uint64_t mixed_sum_baseline(const void* data, size_t element_size, uint64_t count, uint64_t first_position, Mix mix) {
  check_mixed_args(element_size, mix);
  return baseline_words(static_cast<const unsigned char*>(data), element_size, count, first_position, mix);
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  RETRACE_CHECK(ctx_ != nullptr, InvariantError, "EVP_MD_CTX_new failed (out of memory)");
  RETRACE_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1, InvariantError,
                "EVP_DigestInit_ex(sha256) failed");
}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(const void* data, size_t size) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size); }
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

namespace {

// One pass over a file: the calling thread reads blocks, a second thread hashes each block once it
// has been read. `dest(offset, len)` says where a block goes: into the caller's buffer (the whole
// file is kept), or into a ring of kRing blocks that the hasher hands back. Small files are read
// and hashed inline. Returns the number of bytes read; `err` gets the errno of a failed read.
constexpr size_t kBlock = size_t(4) << 20;
constexpr size_t kRing = 4;
constexpr size_t kAhead = 16;
constexpr uint64_t kThreadedFrom = uint64_t(2) * kBlock;

struct Piece {
  const char* data;
  size_t size;
};

// The xxh3-128 of each hash_ahead::kBlock of a file whose bytes come in file order, in pieces of
// any size (a hint's check: hash_ahead.h).
class BlockDigests {
 public:
  void update(const char* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min<uint64_t>(n, hash_ahead::kBlock - at_ % hash_ahead::kBlock);
      x_.update(p, take);
      at_ += take;
      p += take;
      n -= take;
      if (at_ % hash_ahead::kBlock == 0) {
        out_.push_back(x_.digest());
        x_.reset();
      }
    }
  }
  std::vector<Digest128> finish() {
    if (at_ % hash_ahead::kBlock != 0) out_.push_back(x_.digest());
    at_ = 0;
    return std::move(out_);
  }

 private:
  Xxh3 x_;
  uint64_t at_ = 0;
  std::vector<Digest128> out_;
};

class BlockHasher {
 public:
  // `idle`, when given, is work the hashing thread does while no block waits for it; it returns
  // false when it has nothing (more) to do for now. With `blocks`, each block's xxh3-128 goes there
  // instead of the sha256.
  explicit BlockHasher(bool threaded, std::function<bool()> idle = {}, BlockDigests* blocks = nullptr)
      : idle_(std::move(idle)), blocks_(blocks) {
    if (threaded) worker_ = std::thread([this] { run(); });
  }
  ~BlockHasher() { close(); }
  // Hands a block over to be hashed; the caller keeps it unchanged until wait_hashed says so.
  void push(Piece p) {
    if (!worker_.joinable()) {
      hash(p);
      ++hashed_;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(p);
    ++pushed_;
    ready_.notify_one();
  }
  // Blocks until every block pushed so far except the newest `keep` has been hashed.
  void wait_hashed(size_t keep) {
    if (!worker_.joinable()) return;
    std::unique_lock<std::mutex> lock(mu_);
    room_.wait(lock, [&] { return hashed_ + keep >= pushed_; });
  }
  std::string finish_hex() {
    close();
    return sha_.finish_hex();
  }

 private:
  void run() {
    for (;;) {
      Piece p{};
      {
        std::unique_lock<std::mutex> lock(mu_);
        while (queue_.empty() && !done_ && idle_) {
          lock.unlock();
          const bool more = idle_();
          lock.lock();
          if (!more) break;
        }
        ready_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = queue_.front();
      }
      hash(p);
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      ++hashed_;
      room_.notify_all();
    }
  }
  void hash(Piece p) {
    if (blocks_) blocks_->update(p.data, p.size);
    else sha_.update(p.data, p.size);
  }
  void close() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      ready_.notify_one();
    }
    worker_.join();
  }

  Sha256 sha_;
  std::function<bool()> idle_;
  BlockDigests* blocks_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable ready_, room_;
  std::deque<Piece> queue_;
  size_t pushed_ = 0, hashed_ = 0;
  bool done_ = false;
};

// Reads up to `size` bytes of fd into dest(offset, want) blocks and hashes them; returns the bytes
// read. `dest` may lower `want` (a block then ends where its destination does).
template <class Dest>
uint64_t read_and_hash(int fd, uint64_t size, BlockHasher& hasher, Dest dest, int& err) {
  uint64_t done = 0;
  err = 0;
  // Sequential: the kernel reads ahead further; and the next kAhead blocks are asked for before
  // each block is read, so the disk works while this thread copies and the hasher hashes. (Advice
  // only: a file system that ignores it reads the same bytes.)
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  while (done < size) {
    size_t want = size_t(std::min<uint64_t>(kBlock, size - done));
    if (done + want < size)
      ::posix_fadvise(fd, off_t(done + want), off_t(std::min<uint64_t>(kAhead * kBlock, size - done - want)),
                      POSIX_FADV_WILLNEED);
    char* block = dest(done, want);
    size_t got = 0;
    while (got < want) {
      const ssize_t n = ::read(fd, block + got, want - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) err = errno;
      if (n <= 0) break;
      got += size_t(n);
    }
    if (got > 0) hasher.push({block, got});
    done += got;
    if (got < want) break;
  }
  return done;
}

}  // namespace

std::string sha256_file_hex(const std::string& path, fs::Links links) {
  uint64_t size = 0;
  const int fd = fs::open_regular_file_within(path, UINT64_MAX, size, links);
  int err = 0;
  std::string hex;
  {
    BlockHasher hasher(size >= kThreadedFrom);
    std::vector<char> ring(kRing * kBlock);
    size_t next = 0;
    // A block of the ring is reused only after the hasher is done with it: before a block is read,
    // at most kRing - 1 others still wait to be hashed. Read to the end of the file, as a plain
    // read loop would, even if it grew after the stat (the size only chose the threading).
    (void)read_and_hash(
        fd, UINT64_MAX, hasher,
        [&](uint64_t, size_t&) {
          hasher.wait_hashed(kRing - 1);
          char* b = ring.data() + (next % kRing) * kBlock;
          ++next;
          return b;
        },
        err);
    hex = hasher.finish_hex();
  }
  ::close(fd);
  RETRACE_CHECK(err == 0, IoError, "read error in ", path, " while computing its sha256: ", fs::errno_text(err));
  return hex;
}

namespace {
#ifdef MADV_POPULATE_WRITE
// Has the kernel make the pages of [from, to) present and writable (their contents unchanged);
// false where it cannot (an older kernel).
bool populate_pages(char* from, char* to, uint64_t page) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(from) / page * page;
  return ::madvise(reinterpret_cast<void*>(start), size_t(reinterpret_cast<uintptr_t>(to) - start),
                   MADV_POPULATE_WRITE) == 0;
}
#endif

// The single pass of read_file_sha256 and read_file_sha256_into over the open `fd` of `size`
// bytes: each segment's bytes land at its dest, the rest go through a ring and are only hashed.
// Returns the sha256 (hex); `got`: the bytes read; `err`: the errno of a failed read.
std::string read_segments_and_hash(int fd, uint64_t size, const std::vector<FileSegment>& segments, uint64_t& got,
                                   int& err, BlockDigests* blocks = nullptr) {
  std::vector<char> ring;  // for the bytes no segment takes (a shard's header): hashed only
  size_t next_ring = 0, seg = 0, ahead_seg = 0;
  std::atomic<uint64_t> reading_at{0};
  uint64_t populated = 0;
  // Fresh memory costs a page fault and a zeroed page per 4 KiB on first write, about as much as
  // the read's copy; left to the reading thread it would make that thread, not sha256, the slower
  // of the two. So the hashing thread, when it waits for a block, has the kernel populate the
  // destination pages of the next blocks (MADV_POPULATE_WRITE never changes a page already
  // present, so it cannot race with the read that fills them).
  auto populate = [&, page = uint64_t(::sysconf(_SC_PAGESIZE))]() -> bool {
#ifdef MADV_POPULATE_WRITE
    const uint64_t at = reading_at.load();
    const uint64_t from = std::max(populated, at + kBlock), limit = std::min(size, at + kAhead * kBlock);
    while (ahead_seg < segments.size() && segments[ahead_seg].offset + segments[ahead_seg].size <= from) ++ahead_seg;
    if (from >= limit || ahead_seg == segments.size()) return false;
    const FileSegment& s = segments[ahead_seg];
    const uint64_t a = std::max(from, s.offset);
    if (a >= limit) return false;
    const uint64_t b = std::min({a + kBlock, s.offset + s.size, limit});
    char* const p = s.dest + (a - s.offset);
    populated = populate_pages(p, p + (b - a), page) ? b : size;  // an older kernel: the read faults them in
    return true;
#else
    return false;
#endif
  };
  BlockHasher hasher(size >= kThreadedFrom, populate, blocks);
  got = read_and_hash(
      fd, size, hasher,
      [&](uint64_t offset, size_t& want) -> char* {
        reading_at = offset;
        while (seg < segments.size() && segments[seg].offset + segments[seg].size <= offset) ++seg;
        if (seg < segments.size() && segments[seg].offset <= offset) {
          const FileSegment& s = segments[seg];
          want = size_t(std::min<uint64_t>(want, s.offset + s.size - offset));
          return s.dest + (offset - s.offset);
        }
        if (seg < segments.size()) want = size_t(std::min<uint64_t>(want, segments[seg].offset - offset));
        // A ring block is reused only once hashed: at most kRing - 1 blocks wait before it.
        if (ring.empty()) ring.resize(kRing * kBlock);
        hasher.wait_hashed(kRing - 1);
        return ring.data() + (next_ring++ % kRing) * kBlock;
      },
      err);
  return hasher.finish_hex();
}
}  // namespace

HashedFile read_file_sha256(const std::string& path, uint64_t max_bytes, fs::Links links) {
  uint64_t file_size = 0;
  const int fd = fs::open_regular_file_within(path, max_bytes, file_size, links);
  HashedFile out;
  out.bytes = fs::FileBytes(size_t(file_size));
  int err = 0;
  uint64_t got = 0;
  std::vector<FileSegment> whole;
  if (file_size > 0) whole.push_back({0, file_size, out.bytes.data()});
  out.sha256 = read_segments_and_hash(fd, file_size, whole, got, err);
  ::close(fd);
  RETRACE_CHECK(err == 0, IoError, "read error in ", path, ": ", fs::errno_text(err));
  out.bytes.shrink_to(size_t(got));
  return out;
}

std::string read_file_sha256_into(const std::string& path, uint64_t max_bytes, const std::vector<FileSegment>& segments,
                                  uint64_t& got, fs::Links links) {
  for (size_t i = 1; i < segments.size(); ++i)
    RETRACE_CHECK(segments[i].offset >= segments[i - 1].offset + segments[i - 1].size, InvariantError,
                  "read_file_sha256_into: segments out of order or overlapping at ", i);
  uint64_t file_size = 0;
  const int fd = fs::open_regular_file_within(path, max_bytes, file_size, links);
  int err = 0;
  if (hash_ahead::is_for(fd)) {
    // The launcher's child hashed this file while the trainer started: read it with the blocks'
    // xxh3 only, and take its sha256 if the blocks agree; else read it again, hashing it here.
    BlockDigests blocks;
    (void)read_segments_and_hash(fd, file_size, segments, got, err, &blocks);
    const std::optional<std::string> sha = hash_ahead::confirm(blocks.finish(), got);
    if (err == 0 && sha) {
      ::close(fd);
      return *sha;
    }
    err = ::lseek(fd, 0, SEEK_SET) == 0 ? 0 : errno;
  }
  const std::string hex = err != 0 ? std::string() : read_segments_and_hash(fd, file_size, segments, got, err);
  ::close(fd);
  RETRACE_CHECK(err == 0, IoError, "read error in ", path, ": ", fs::errno_text(err));
  return hex;
}

}  // namespace retrace
