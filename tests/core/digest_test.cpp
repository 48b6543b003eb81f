#include "core/digest.h"

#include <gtest/gtest.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "core/parse_number.h"
#include "testing/random_bytes.h"

namespace retrace {
namespace {

TEST(Digest, Sha256KnownVector) {
  // FIPS 180-2 example "abc".
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// The one-pass readers (a second thread hashes each 4 MiB block as it is read; the hashing thread
// populates the pages ahead) against the plain path they replace: a whole read, then sha256 of the
// bytes in memory. Sizes at and around every edge: empty, one byte, the block, the size from which
// a thread is used (two blocks), a block count plus and minus one, a file larger than the ring.
TEST(Digest, OnePassReadAndHashEqualThePlainPath) {
  const std::string dir = ::testing::TempDir() + "/retrace-digest-onepass";
  std::filesystem::create_directories(dir);
  const size_t mib = size_t(1) << 20;
  for (size_t size : {size_t(0), size_t(1), 4 * mib - 1, 4 * mib, 4 * mib + 1, 8 * mib - 1, 8 * mib, 8 * mib + 1,
                      12 * mib + 4097, 37 * mib + 3}) {
    std::string bytes = testing::random_bytes(size, size);
    const std::string path = dir + "/f" + std::to_string(size);
    {
      std::ofstream out(path, std::ios::binary);
      out.write(bytes.data(), std::streamsize(bytes.size()));
    }
    const std::string plain = sha256_hex(bytes.data(), bytes.size());
    const std::string plain_file = sha256_hex(fs::read_file(path).data(), size);
    ASSERT_EQ(plain, plain_file) << size;
    HashedFile f = read_file_sha256(path, size);
    EXPECT_EQ(f.sha256, plain) << size;
    ASSERT_EQ(f.bytes.size(), size);
    EXPECT_TRUE(f.bytes.view() == bytes) << size;
    EXPECT_EQ(sha256_file_hex(path), plain) << size;
    EXPECT_EQ(fs::read_file_bytes(path, size).view(), bytes) << size;
    if (size > 0) {
      EXPECT_THROW(read_file_sha256(path, size - 1), FormatError) << size;
      // One byte changed anywhere changes the digest (negative control).
      bytes[size / 2] ^= 1;
      EXPECT_NE(sha256_hex(bytes.data(), bytes.size()), f.sha256) << size;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Digest, Xxh3StreamingEqualsOneShot) {
  std::string s(10000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  Xxh3 h;
  h.update(s.data(), 1234);
  h.update(s.data() + 1234, s.size() - 1234);
  EXPECT_EQ(h.digest(), xxh3_128(s.data(), s.size()));
  EXPECT_NE(h.digest(), xxh3_128(s.data(), s.size() - 1));
  EXPECT_EQ(h.digest().hex().size(), 32u);
}

TEST(Digest, U64IsLittleEndian) {
  Xxh3 a, b;
  a.update_u64(0x0102030405060708ull);
  const unsigned char le[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  b.update(le, 8);
  EXPECT_EQ(a.digest(), b.digest());
}

}  // namespace
}  // namespace retrace

namespace retrace {
namespace {
// The definition of lane_sums, word by word, for comparison.
void lane_sums_reference(const std::vector<unsigned char>& bytes, uint64_t out[16]) {
  uint64_t a[8] = {}, b[8] = {};
  const size_t words = (bytes.size() + 7) / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    for (size_t k = 0; k < 8 && i * 8 + k < bytes.size(); ++k) w |= static_cast<uint64_t>(bytes[i * 8 + k]) << (8 * k);
    a[i % 8] += w;
    b[i % 8] += a[i % 8];
  }
  for (int l = 0; l < 8; ++l) {
    out[l] = a[l];
    out[8 + l] = b[l];
  }
}
}  // namespace

TEST(Digest, MixedSumsAreTheirDefinition) {
  // Values from an independent Python implementation of the definition (digest.h).
  const float xs[3] = {1.0f, -2.5f, 3.25f};
  EXPECT_EQ(mixed_sum(xs, 4, 3, 0), 0xc1bb586406036382ull);
  EXPECT_EQ(mixed_sum(xs, 4, 3, 10), 0x905f4ec69eb54aa6ull);  // the same words at other positions
  EXPECT_EQ(mix_position_word(0, 0), 0x9ca066f1a4ab2eeaull);
  EXPECT_EQ(mix_position_word(~uint64_t{0}, 5), 0xd66ad737d54c5575ull);  // position + 1 wraps to 0
  EXPECT_EQ(mixed_sum(xs, 4, 0, 7), 0u);
  EXPECT_THROW(mixed_sum(xs, 3, 1, 0), InvariantError);
}

// Version 4's mix, against its definition written out here: x = w + (p + 1) * phi, then
// lo(x) * hi(x) + x, all modulo 2^64.
TEST(Digest, HalvesMixIsItsDefinition) {
  auto definition = [](uint64_t p, uint64_t w) {
    const unsigned __int128 x = (static_cast<unsigned __int128>(w) +
                                 (static_cast<unsigned __int128>(p) + 1) * 0x9E3779B97F4A7C15ull) &
                                ~uint64_t{0};
    const uint64_t x64 = static_cast<uint64_t>(x), lo = x64 & 0xffffffffull, hi = x64 >> 32;
    return static_cast<uint64_t>(static_cast<unsigned __int128>(lo) * hi + x64);
  };
  for (uint64_t p : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}})
    for (uint64_t w : {uint64_t{0}, uint64_t{5}, uint64_t{0xffffffffull}, ~uint64_t{0}})
      EXPECT_EQ(mix_halves(p, w), definition(p, w)) << p << " " << w;
  const float xs[3] = {1.0f, -2.5f, 3.25f};
  uint32_t words[3];
  std::memcpy(words, xs, sizeof words);
  EXPECT_EQ(mixed_sum(xs, 4, 3, 10, Mix::kHalves),
            mix_halves(10, words[0]) + mix_halves(11, words[1]) + mix_halves(12, words[2]));
  EXPECT_NE(mixed_sum(xs, 4, 3, 10, Mix::kHalves), mixed_sum(xs, 4, 3, 10, Mix::kFmix64));
  EXPECT_EQ(mixed_sum(xs, 4, 0, 7, Mix::kHalves), 0u);
  EXPECT_THROW(mixed_sum(xs, 3, 1, 0, Mix::kHalves), InvariantError);
  EXPECT_THROW(mixed_sum(xs, 4, 1, 0, static_cast<Mix>(7)), InvariantError);
}

// The vector build (AVX-512 DQ, where the CPU has it) sums what the baseline build does: every
// element size, lengths around the vector widths, any first position (wrapping ones too).
TEST(Digest, MixedSumsOfEveryBuildAgree) {
  std::vector<unsigned char> bytes(8 * 1000 + 8);
  uint64_t x = 0x243F6A8885A308D3ull;
  for (auto& b : bytes) b = static_cast<unsigned char>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
  for (size_t size : {1, 2, 4, 8})
    for (uint64_t count : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 999, 1000})
      for (uint64_t first : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40, ~uint64_t{0} - 3})
        for (size_t offset : {0, 1, 3})
          for (Mix mix : {Mix::kFmix64, Mix::kHalves})
            EXPECT_EQ(mixed_sum(bytes.data() + offset, size, count, first, mix),
                      mixed_sum_baseline(bytes.data() + offset, size, count, first, mix))
                << size << " bytes x " << count << " from " << first << " at offset " << offset << " mix " << int(mix);
}

class MixedSums : public ::testing::TestWithParam<Mix> {};
INSTANTIATE_TEST_SUITE_P(Digest, MixedSums, ::testing::Values(Mix::kFmix64, Mix::kHalves),
                         [](const auto& info) { return info.param == Mix::kFmix64 ? "version3" : "version4"; });

TEST_P(MixedSums, SlicesAddUpAndSwapsAndPairsOfChangesShow) {
  const Mix mix = GetParam();
  auto mixed_sum = [mix](const void* d, size_t size, uint64_t count, uint64_t first) {
    return retrace::mixed_sum(d, size, count, first, mix);
  };
  auto mix_position_word = [mix](uint64_t p, uint64_t w) {
    return mix == Mix::kHalves ? mix_halves(p, w) : retrace::mix_position_word(p, w);
  };
  std::vector<uint16_t> a(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i * 7919u);
  const uint64_t whole = mixed_sum(a.data(), 2, a.size(), 0);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{333}, size_t{999}, size_t{1000}})
    EXPECT_EQ(mixed_sum(a.data(), 2, cut, 0) + mixed_sum(a.data() + cut, 2, a.size() - cut, cut), whole) << cut;
  // A swap of two unequal elements, and +d / -d on two of them: a plain sum (and XOR, for the
  // swap) of the words stays, the mixed sum does not.
  std::vector<uint16_t> swapped = a, pair = a;
  std::swap(swapped[10], swapped[500]);
  pair[10] = static_cast<uint16_t>(pair[10] + 3);
  pair[500] = static_cast<uint16_t>(pair[500] - 3);
  auto plain = [](const std::vector<uint16_t>& v) {
    uint64_t s = 0;
    for (uint16_t w : v) s += w;
    return s;
  };
  ASSERT_EQ(plain(swapped), plain(a));
  ASSERT_EQ(plain(pair), plain(a));
  EXPECT_NE(mixed_sum(swapped.data(), 2, swapped.size(), 0), whole);
  EXPECT_NE(mixed_sum(pair.data(), 2, pair.size(), 0), whole);
  // Every element size reads its own width: 8 bytes as one word or two.
  const uint64_t w[2] = {0x0123456789abcdefull, 42};
  EXPECT_NE(mixed_sum(w, 8, 2, 0), mixed_sum(w, 4, 4, 0));
  EXPECT_EQ(mixed_sum(w, 8, 2, 0), mix_position_word(0, w[0]) + mix_position_word(1, w[1]));
  // Every swap of two unequal float words of a 4096-element tensor, and every pair of changes
  // +d / -d, among 2000 random ones: each changes the sum.
  std::vector<uint32_t> f(4096);
  uint64_t x = 0x853c49e6748fea9bull;
  auto next = [&] { return static_cast<uint32_t>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 32); };
  for (auto& v : f) v = next();
  const uint64_t base = mixed_sum(f.data(), 4, f.size(), 0);
  int seen_swaps = 0, seen_pairs = 0;
  for (int k = 0; k < 2000; ++k) {
    const size_t i = next() % f.size(), j = next() % f.size();
    if (i == j || f[i] == f[j]) continue;
    std::swap(f[i], f[j]);
    seen_swaps += mixed_sum(f.data(), 4, f.size(), 0) != base;
    std::swap(f[i], f[j]);
    const uint32_t d = next() | 1;
    f[i] += d;
    f[j] -= d;
    seen_pairs += mixed_sum(f.data(), 4, f.size(), 0) != base;
    f[i] -= d;
    f[j] += d;
    ASSERT_EQ(mixed_sum(f.data(), 4, f.size(), 0), base);
  }
  EXPECT_GT(seen_swaps, 1900);
  EXPECT_GT(seen_pairs, 1900);
  int missed = 0, tried = 0;
  for (int k = 0; k < 2000; ++k, ++tried) {
    const size_t i = next() % f.size(), j = next() % f.size();
    if (i == j || f[i] == f[j]) continue;
    std::swap(f[i], f[j]);
    missed += mixed_sum(f.data(), 4, f.size(), 0) == base;
    std::swap(f[i], f[j]);
  }
  EXPECT_EQ(missed, 0) << "of " << tried;
}

TEST(Digest, LaneSumsFollowTheirDefinitionAtEverySize) {
  // Whole 64-byte blocks, odd tails and large sizes: the vectorized loop must give the
  // word-by-word definition exactly.
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{63}, size_t{65}, size_t{4097},
                      (size_t{1} << 19) - 1, size_t{1} << 19, (size_t{1} << 19) + 9, (size_t{3} << 20) + 13}) {
    std::vector<unsigned char> bytes(size);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto& c : bytes) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      c = static_cast<unsigned char>(x);
    }
    uint64_t got[16], want[16];
    lane_sums(bytes.data(), bytes.size(), got);
    lane_sums_reference(bytes, want);
    for (int l = 0; l < 16; ++l) ASSERT_EQ(got[l], want[l]) << "size " << size << " lane " << l;
    if (size > 0) {  // one changed byte changes the sums
      bytes[size / 3] ^= 1;
      uint64_t changed[16];
      lane_sums(bytes.data(), bytes.size(), changed);
      EXPECT_NE(std::vector<uint64_t>(got, got + 16), std::vector<uint64_t>(changed, changed + 16)) << size;
    }
  }
}

TEST(Digest, LaneSumsOfPartsAppendToThoseOfTheWhole) {
  // A string cut at multiples of 64 bytes, each part summed alone, then appended in order: the
  // sums of the whole (the fused AdamW sums parts of one tensor on two threads).
  std::vector<unsigned char> bytes((size_t{1} << 16) + 37);
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (auto& c : bytes) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<unsigned char>(x);
  }
  for (size_t size : {size_t{0}, size_t{5}, size_t{64}, size_t{200}, size_t{4096 + 9}, bytes.size()}) {
    uint64_t want[16];
    lane_sums(bytes.data(), size, want);
    for (const std::vector<size_t>& cuts :
         {std::vector<size_t>{}, {0}, {64}, {128, 192}, {64, 1024, 4096}, {size - size % 64}}) {
      LaneSums whole;
      size_t at = 0;
      bool fits = true;
      for (size_t cut : cuts) fits = fits && cut >= at && cut <= size, at = cut;
      if (!fits) continue;
      at = 0;
      for (size_t cut : cuts) {
        LaneSums part;
        part.add(bytes.data() + at, cut - at);
        whole.append(part);
        at = cut;
      }
      LaneSums last;
      last.add(bytes.data() + at, size - at);
      whole.append(last);
      uint64_t got[16];
      whole.finish(got);
      for (int l = 0; l < 16; ++l) ASSERT_EQ(got[l], want[l]) << "size " << size << " lane " << l;
    }
  }
  // Appending after a part that ends inside a block would shift the lanes.
  LaneSums odd, more;
  odd.add(bytes.data(), 60);
  more.add(bytes.data(), 64);
  EXPECT_THROW(odd.append(more), InvariantError);
}

// Numbers read from files: digits only, in range; never a sign, a space, a suffix or an exponent,
// and never std::invalid_argument (an internal error) for any of them.
TEST(ParseNumber, DecimalDigitsOnlyWithinRange) {
  EXPECT_EQ(parse_decimal_u64("0"), 0u);
  EXPECT_EQ(parse_decimal_u64("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_decimal_u64("007"), 7u);
  for (const char* bad :
       {"", "-1", "+1", " 7", "7 ", "1e3", "a:b", "0x10", "18446744073709551616", "99999999999999999999999", "1.0"})
    EXPECT_FALSE(parse_decimal_u64(bad).has_value()) << bad;
  EXPECT_EQ(parse_u64_field("41", "the field"), 41u);
  EXPECT_THROW(parse_u64_field("42", "the field", 41), FormatError);
  try {
    parse_u64_field("a:b", "checkpoint X metadata \"samples_seen\"");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("samples_seen\" is \"a:b\""), std::string::npos) << e.what();
  }
}

// A digest's hex text: exactly 32 hex digits (std::stoull took a sign, "0x" and trailing junk).
TEST(ParseNumber, DigestHexIsExactly32HexDigits) {
  const Digest128 d{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(parse_digest_hex(d.hex(), "here", "chain"), d);
  EXPECT_EQ(parse_digest_hex("0123456789ABCDEFFEDCBA9876543210", "here", "chain"), d);
  for (const std::string& bad :
       std::vector<std::string>{std::string(31, '0'), std::string(33, '0'), "-123456789abcdeffedcba9876543210",
                                "0x23456789abcdeffedcba9876543210", "0123456789abcdefzzzzzzzzzzzzzzzz",
                                " 123456789abcdeffedcba9876543210"})
    EXPECT_THROW(parse_digest_hex(bad, "here", "chain"), FormatError) << bad;
}

// A checkpoint's files are read without following a link at the last component.
TEST(FileUtil, ReadsRefuseALinkWhenAsked) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "retrace-links-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  fs::write_file_atomic((dir / "real").string(), "bytes");
  std::filesystem::create_symlink(dir / "real", dir / "link");
  EXPECT_EQ(fs::read_file((dir / "link").string()), "bytes");
  EXPECT_THROW(fs::read_file((dir / "link").string(), 100, fs::Links::kRefuse), FormatError);
  EXPECT_THROW(sha256_file_hex((dir / "link").string(), fs::Links::kRefuse), FormatError);
  EXPECT_EQ(fs::read_file((dir / "real").string(), 100, fs::Links::kRefuse), "bytes");
  std::filesystem::remove_all(dir);
}

}  // namespace retrace
