// A shard hashed ahead (core/hash_ahead.h): the launcher's child hashes a file while the trainer
// starts, and read_file_sha256_into takes that sha256 only for the very file the child hashed, when
// every 4 MiB block it read has the child's xxh3; otherwise it hashes the file itself.
#include "core/hash_ahead.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/digest.h"
#include "testing/random_bytes.h"

namespace retrace {
namespace {

struct TestFile {
  std::string path, bytes;
};
TestFile write_file(const std::string& name, size_t size, uint64_t seed) {
  const std::string dir = ::testing::TempDir() + "/retrace-hash-ahead";
  std::filesystem::create_directories(dir);
  TestFile f{dir + "/" + name, testing::random_bytes(size, seed)};
  std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
  out.write(f.bytes.data(), std::streamsize(f.bytes.size()));
  return f;
}

// Reads `f` as a shard load does: its first 100 bytes (a header) only hashed, the rest into a
// buffer; the bytes must land, and the sha256 is returned.
std::string read_as_a_load_does(const TestFile& f) {
  std::string into(f.bytes.size() > 100 ? f.bytes.size() - 100 : 0, '\0');
  std::vector<FileSegment> segments;
  if (!into.empty()) segments.push_back({100, into.size(), into.data()});
  uint64_t got = 0;
  const std::string sha = read_file_sha256_into(f.path, f.bytes.size(), segments, got);
  EXPECT_EQ(got, f.bytes.size());
  EXPECT_TRUE(into.empty() || into == f.bytes.substr(100)) << f.path;
  return sha;
}

// A child of this process that writes `records` to a pipe and exits with `code`; the pipe's read end.
int fake_child(const std::string& records, int code, pid_t& pid) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    const bool ok = ::write(p[1], records.data(), records.size()) == ssize_t(records.size());
    ::_exit(ok ? code : 99);
  }
  ::close(p[1]);
  return p[0];
}

hash_ahead::Identity identity_of_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  const std::optional<hash_ahead::Identity> id = hash_ahead::identity_of(fd);
  ::close(fd);
  EXPECT_TRUE(id.has_value()) << path;
  return id.value_or(hash_ahead::Identity{});
}

// The launcher's way, in this process: start() forks the child and names it in the environment,
// adopt() takes it. The file's sha256 comes from the child, the bytes are read as ever; at sizes
// around the 4 MiB block, and empty.
TEST(HashAhead, TheChildsSha256IsTakenForTheFileItHashed) {
  const size_t mib = size_t(1) << 20;
  for (size_t size : {size_t(0), size_t(101), 4 * mib - 1, 4 * mib, 4 * mib + 1, 9 * mib + 3}) {
    const TestFile f = write_file("taken" + std::to_string(size), size, size);
    const uint32_t taken = hash_ahead::stats().taken;
    ASSERT_TRUE(hash_ahead::start(f.path)) << size;
    ASSERT_NE(std::getenv(hash_ahead::kEnv), nullptr);
    hash_ahead::adopt();
    EXPECT_EQ(std::getenv(hash_ahead::kEnv), nullptr) << "a process the trainer starts would inherit the hint";
    EXPECT_EQ(read_as_a_load_does(f), sha256_hex(f.bytes.data(), f.bytes.size())) << size;
    EXPECT_EQ(hash_ahead::stats().taken, taken + 1) << size;
    // Used once: the next read of the same file hashes it here.
    EXPECT_EQ(read_as_a_load_does(f), sha256_hex(f.bytes.data(), f.bytes.size())) << size;
    EXPECT_EQ(hash_ahead::stats().taken, taken + 1) << size;
  }
}

// The hint waits for its own file: another file read first is hashed here, and a copy of the
// hinted file (another inode, the same bytes) is not the file the child hashed.
TEST(HashAhead, AnotherFileIsHashedHereAndTheHintWaitsForItsOwn) {
  const TestFile hinted = write_file("hinted", 5 << 20, 1), other = write_file("other", 3 << 20, 2);
  TestFile copy = write_file("copy", 0, 0);
  std::filesystem::copy_file(hinted.path, copy.path, std::filesystem::copy_options::overwrite_existing);
  copy.bytes = hinted.bytes;
  const hash_ahead::Stats before = hash_ahead::stats();
  ASSERT_TRUE(hash_ahead::start(hinted.path));
  hash_ahead::adopt();
  EXPECT_EQ(read_as_a_load_does(other), sha256_hex(other.bytes.data(), other.bytes.size()));
  EXPECT_EQ(read_as_a_load_does(copy), sha256_hex(copy.bytes.data(), copy.bytes.size()));
  EXPECT_EQ(hash_ahead::stats().taken, before.taken);
  EXPECT_EQ(hash_ahead::stats().refused, before.refused);
  EXPECT_EQ(read_as_a_load_does(hinted), sha256_hex(hinted.bytes.data(), hinted.bytes.size()));
  EXPECT_EQ(hash_ahead::stats().taken, before.taken + 1);
}

// What the child says is checked against what the trainer read: a block whose xxh3 differs (the
// file changed between the child's pass and the read), a child that exits non-zero, a record cut
// short, a count of blocks that is not the file's: each refused, the file hashed here instead, the
// bytes read right. Negative control: the same records, the digests untouched, are taken.
TEST(HashAhead, AChildsWordThatDoesNotMatchTheReadIsRefusedAndTheFileHashedHere) {
  const TestFile f = write_file("refused", (9 << 20) + 5, 3);
  const std::string sha = sha256_hex(f.bytes.data(), f.bytes.size());
  const hash_ahead::BlockedHash right = hash_ahead::hash_blocks(f.bytes.data(), f.bytes.size());
  ASSERT_EQ(right.sha256, sha);
  ASSERT_EQ(right.blocks.size(), 3u);
  const std::string id = hash_ahead::identity_record(identity_of_path(f.path));
  // The child's sha256 is taken when the blocks agree; a wrong one would show here (and be refused by
  // the manifest's sha256 in a load), so the fakes claim a sha256 the file does not have.
  hash_ahead::BlockedHash claimed = right;
  claimed.sha256 = std::string(64, 'a');
  hash_ahead::BlockedHash one_block_off = claimed;
  one_block_off.blocks[1].lo ^= 1;
  hash_ahead::BlockedHash too_few = claimed;
  too_few.blocks.pop_back();
  const std::string full = hash_ahead::digests_record(claimed);
  struct Case {
    const char* what;
    std::string records;
    int code;
    bool taken;
  };
  const std::vector<Case> cases = {
      {"the claim, digests right", id + full, 0, true},
      {"one block's xxh3 differs", id + hash_ahead::digests_record(one_block_off), 0, false},
      {"the child failed", id + full, 1, false},
      {"the record cut short", id + full.substr(0, full.size() - 5), 0, false},
      {"a block too few", id + hash_ahead::digests_record(too_few), 0, false},
      {"no identity", std::string(), 0, false},
  };
  for (const Case& c : cases) {
    const hash_ahead::Stats before = hash_ahead::stats();
    pid_t pid = -1;
    const int fd = fake_child(c.records, c.code, pid);
    hash_ahead::adopt_for_test(fd, pid);
    const std::string got = read_as_a_load_does(f);
    EXPECT_EQ(got, c.taken ? claimed.sha256 : sha) << c.what;
    EXPECT_EQ(hash_ahead::stats().taken, before.taken + (c.taken ? 1 : 0)) << c.what;
    const bool identity_read = !c.records.empty();
    EXPECT_EQ(hash_ahead::stats().refused, before.refused + (!c.taken && identity_read ? 1 : 0)) << c.what;
    ::waitpid(pid, nullptr, 0);  // a refused hint may leave its child unreaped
  }
}

// A variable that names no pipe, or no child of this process, is dropped: nothing read from the fd.
TEST(HashAhead, AVariableThatNamesNoPipeOrNoChildIsIgnored) {
  const TestFile f = write_file("ignored", 1 << 20, 4);
  const int file = ::open(f.path.c_str(), O_RDONLY);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(p[1], "RTHAHD01", 8), 8);
  ::close(p[1]);  // a reader that should not have read it would see its end, not wait
  const hash_ahead::Stats before = hash_ahead::stats();
  for (const std::string& v :
       {std::to_string(file) + ":" + std::to_string(::getpid()), std::to_string(p[0]) + ":1", std::string("x:y"),
        std::string("12"), std::to_string(p[0]) + ":" + std::to_string(::getppid())}) {
    ASSERT_EQ(::setenv(hash_ahead::kEnv, v.c_str(), 1), 0);
    hash_ahead::adopt();
    EXPECT_EQ(std::getenv(hash_ahead::kEnv), nullptr) << v;
    EXPECT_EQ(read_as_a_load_does(f), sha256_hex(f.bytes.data(), f.bytes.size())) << v;
  }
  EXPECT_EQ(hash_ahead::stats().taken, before.taken);
  EXPECT_EQ(hash_ahead::stats().refused, before.refused);
  char rest[8];
  EXPECT_EQ(::read(p[0], rest, 8), 8) << "the pipe was read although it named no child";
  ::close(p[0]);
  ::close(file);
}

}  // namespace
}  // namespace retrace
