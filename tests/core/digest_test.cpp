#include "core/digest.h"

#include <gtest/gtest.h>

namespace retrace {
namespace {

TEST(Digest, Sha256KnownVector) {
  // FIPS 180-2 example "abc".
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
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
