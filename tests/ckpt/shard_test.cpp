// Shard format: round trip, the safetensors layout, validation of hostile headers, write faults.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "ckpt/ckpt_test_util.h"
#include "ckpt/shard.h"
#include "core/digest.h"
#include "core/disk_wait.h"
#include "core/error.h"

namespace retrace::ckpt {
namespace {

using safetensors::direct_writes;
using safetensors::set_direct_writes;
using testing::TempDir;

uint64_t le64(const std::string& b, size_t at = 0) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return n;
}

std::string le64_bytes(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(n >> (8 * i));
  return s;
}

// A shard file from a header text and a data section, as a hostile writer would make it.
std::string raw_shard(const std::string& header, const std::string& data) {
  return le64_bytes(header.size()) + header + data;
}

struct Sample {
  std::vector<float> w{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int64_t> step{42};
  std::vector<uint8_t> mask{1, 0, 1};
  std::vector<uint16_t> half{0x3c00, 0xc000};
  std::vector<TensorView> views() const {
    return {{"w", "F32", {2, 3}, w.data(), 24},
            {"step", "I64", {}, step.data(), 8},
            {"mask", "BOOL", {3}, mask.data(), 3},
            {"half", "BF16", {2}, half.data(), 4},
            {"empty", "F64", {0, 5}, nullptr, 0}};
  }
};

// write_shard past the page cache (set_direct_writes) for as long as it lives.
struct DirectWrites {
  const bool before = direct_writes();
  explicit DirectWrites(bool on) { set_direct_writes(on); }
  ~DirectWrites() { set_direct_writes(before); }
};

TEST(Shard, RoundTripBytesAndMetadata) {
  TempDir tmp;
  Sample s;
  std::map<std::string, std::string> md = {{"schema", "ckpt.v1"}, {"step", "7"}, {"note", "h\u00e9llo \"q\""}};
  const std::string path = tmp.file("a.safetensors");
  ShardFileInfo info = write_shard(path, md, s.views());
  EXPECT_EQ(info.file, "a.safetensors");
  EXPECT_EQ(info.size, std::filesystem::file_size(path));
  EXPECT_EQ(info.sha256, sha256_file_hex(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  ShardData d = read_shard(path);
  EXPECT_EQ(d.metadata, md);
  ASSERT_EQ(d.tensors.size(), 5u);
  for (const TensorView& v : s.views()) {
    const TensorEntry* e = d.find(v.name);
    ASSERT_NE(e, nullptr) << v.name;
    EXPECT_EQ(e->dtype, v.dtype);
    EXPECT_EQ(e->shape, v.shape);
    ASSERT_EQ(e->nbytes, v.nbytes);
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(d.data(*e), v.data, v.nbytes), 0) << v.name;
    }
  }
}

TEST(Shard, SafetensorsLayout) {
  TempDir tmp;
  Sample s;
  const std::string path = tmp.file("b.safetensors");
  write_shard(path, {{"schema", "ckpt.v1"}}, s.views());
  const std::string b = testing::read_all(path);
  const uint64_t n = le64(b);
  ASSERT_LE(8 + n, b.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  EXPECT_EQ(b[8], '{');
  const std::string header = b.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1) << "only spaces may pad the header";
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["schema"], "ckpt.v1");
  // Offsets are relative to the data section, contiguous, and end at EOF; each tensor is aligned to
  // its element size because the writer orders by element size.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [k, v] : j.items()) {
    if (k == "__metadata__") continue;
    uint64_t begin = v["data_offsets"][0], end = v["data_offsets"][1];
    ranges.emplace_back(begin, end);
    EXPECT_EQ(begin % *dtype_size(v["dtype"]), 0u) << k;
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto [begin, end] : ranges) {
    EXPECT_EQ(begin, at);
    at = end;
  }
  EXPECT_EQ(8 + n + at, b.size());
  // The I64 scalar's bytes are little-endian 42.
  uint64_t off = j["step"]["data_offsets"][0];
  EXPECT_EQ(le64(b, 8 + n + off), 42u);
  EXPECT_TRUE(j["step"]["shape"].empty());
}

TEST(Shard, LargeShardHashedInPassMatchesFileDigest) {
  TempDir tmp;
  auto big = testing::pattern_bytes(1, 0, 0, 24u << 20);
  auto small = testing::pattern_bytes(1, 0, 1, 100);
  ShardFileInfo info = write_shard(tmp.file("big.safetensors"), {},
                                   {{"big", "U8", {int64_t(big.size())}, big.data(), big.size()},
                                    {"small", "U8", {100}, small.data(), 100}});
  EXPECT_EQ(info.sha256, sha256_file_hex(tmp.file("big.safetensors")));
  ShardData d = read_shard(tmp.file("big.safetensors"));
  EXPECT_EQ(std::memcmp(d.data(*d.find("big")), big.data(), big.size()), 0);
}

// write_shard says where it waits on the disk (fs::DiskWait): the writebacks that block on a full
// device queue, the file's fsync and its directory's. Each wait calls this thread's hooks once,
// begin then end; the hashing thread beside the writes calls none.
TEST(Shard, AShardWriteCallsTheDiskWaitHooksAroundItsWaitsOnThisThreadOnly) {
  TempDir tmp;
  auto big = testing::pattern_bytes(1, 0, 0, 40u << 20);  // past one writeback (32 MiB)
  int begins = 0, ends = 0, open_waits = 0, most_open = 0;
  const auto me = std::this_thread::get_id();
  bool elsewhere = false;
  fs::set_disk_wait_hooks({[&] {
                             elsewhere |= std::this_thread::get_id() != me;
                             ++begins;
                             most_open = std::max(most_open, ++open_waits);
                           },
                           [&] {
                             ++ends;
                             --open_waits;
                           }});
  ShardFileInfo info = write_shard(tmp.file("big.safetensors"), {},
                                   {{"big", "U8", {int64_t(big.size())}, big.data(), big.size()}});
  fs::set_disk_wait_hooks({});
  EXPECT_EQ(info.sha256, sha256_file_hex(tmp.file("big.safetensors")));
  EXPECT_GE(begins, 3) << "a writeback, the file's fsync and the directory's";
  EXPECT_EQ(begins, ends);
  EXPECT_EQ(most_open, 1) << "waits are not reported nested";
  EXPECT_FALSE(elsewhere);
  const int before = begins;
  write_shard(tmp.file("again.safetensors"), {}, {{"big", "U8", {int64_t(big.size())}, big.data(), big.size()}});
  EXPECT_EQ(begins, before) << "cleared hooks are not called";
}

// A DiskWait inside another calls the hooks only for the outer one; hooks cannot be changed
// during a wait.
TEST(Shard, NestedDiskWaitsCallTheHooksOnce) {
  int begins = 0, ends = 0;
  fs::set_disk_wait_hooks({[&] { ++begins; }, [&] { ++ends; }});
  {
    const fs::DiskWait outer;
    {
      const fs::DiskWait inner;
      EXPECT_EQ(begins, 1);
    }
    EXPECT_EQ(ends, 0);
    EXPECT_THROW(fs::set_disk_wait_hooks({}), InvariantError);
  }
  EXPECT_EQ(ends, 1);
  fs::set_disk_wait_hooks({});
  { const fs::DiskWait none; }
  EXPECT_EQ(begins, 1);
}

TEST(Shard, WriterRejectsContradictoryViews) {
  TempDir tmp;
  float x[2] = {1, 2};
  const std::string p = tmp.file("c.safetensors");
  EXPECT_THROW(write_shard(p, {}, {{"x", "F32", {3}, x, 8}}), InvariantError);
  EXPECT_THROW(write_shard(p, {}, {{"x", "Q8", {2}, x, 2}}), InvariantError);
  EXPECT_THROW(write_shard(p, {}, {{"x", "F32", {-2}, x, 8}}), InvariantError);
  EXPECT_THROW(write_shard(p, {}, {{"x", "F32", {2}, x, 8}, {"x", "F32", {2}, x, 8}}), InvariantError);
  EXPECT_THROW(write_shard(p, {}, {{"__metadata__", "F32", {2}, x, 8}}), InvariantError);
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

void expect_format_error(const std::string& bytes, const std::string& phrase) {
  try {
    parse_shard(bytes, "x.safetensors");
    ADD_FAILURE() << "accepted: " << phrase;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Shard, ReaderRejectsHostileHeaders) {
  const std::string d8(8, 'a');
  expect_format_error("abc", "shorter than its 8-byte header length");
  expect_format_error(le64_bytes(uint64_t(1) << 40) + "{}", "the limit is");
  expect_format_error(le64_bytes(100) + "{}", "the file is truncated");
  expect_format_error(raw_shard("[1]", ""), "'{'");
  expect_format_error(raw_shard("{\"a\":1", ""), "not valid JSON");
  expect_format_error(
      raw_shard(
          R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
          d8),
      "duplicate key \"t\"");
  expect_format_error(raw_shard(R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", d8),
                      "unknown dtype \"Q4\"");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "non-negative");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8), "non-negative");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8), "needs 12 bytes");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
                      "reach past the data section");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", d8),
                      "more elements than fit in int64");
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8),
                      "more bytes than fit in 64 bits");
  // Regression (exit 70 from LibTorch's size check): a zero dim beside dims whose product passes
  // int64 reads as empty for safetensors, but torch::empty refuses it.
  expect_format_error(raw_shard(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", ""),
                      "a zero dim does not make it valid");
  EXPECT_EQ(parse_shard(raw_shard(R"({"t":{"dtype":"F32","shape":[0,4294967296],"data_offsets":[0,0]}})", ""), "z")
                .tensors.at(0)
                .nbytes,
            0u);
  expect_format_error(raw_shard(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", d8), "expected 0");
  expect_format_error(
      raw_shard(
          R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
          d8),
      "expected 6");
  expect_format_error(raw_shard(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", d8),
                      "longer than its header says");
  expect_format_error(raw_shard(R"({"__metadata__":{"a":1}})", ""), "metadata \"a\" must be a string");
  expect_format_error(raw_shard(R"({"__metadata__":[]})", ""), "must be an object");
  expect_format_error(raw_shard(R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8],"x":1}})", d8),
                      "unexpected key \"x\"");
  expect_format_error(raw_shard(R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[8,0]}})", d8),
                      "end before they begin");
  expect_format_error(raw_shard(R"({"t":{"dtype":"U8","shape":[[[[[[[[[[1]]]]]]]]]],"data_offsets":[0,8]}})", d8),
                      "nests deeper");
}

TEST(Shard, EmptyShardIsValid) {
  ShardData d = parse_shard(raw_shard("{}      ", ""), "e");
  EXPECT_TRUE(d.tensors.empty());
}

TEST(Shard, FailedWriteRemovesTmpAndThrowsIoError) {
  TempDir tmp;
  auto big = testing::pattern_bytes(2, 0, 0, 10u << 20);
  const std::string p = tmp.file("f.safetensors");
  testing::write_all(p, "previous content");
  for (uint64_t at : {uint64_t(0), uint64_t(5), uint64_t(4u << 20), uint64_t(10u << 20)}) {
    try {
      write_shard(p, {}, {{"big", "U8", {int64_t(big.size())}, big.data(), big.size()}}, WriteFaults{at, ENOSPC});
      ADD_FAILURE() << "no error at byte " << at;
    } catch (const IoError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
      EXPECT_NE(what.find(p), std::string::npos) << what;
      EXPECT_NE(what.find("failed after " + std::to_string(at) + " of"), std::string::npos) << what;
    }
    EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
    EXPECT_EQ(testing::read_all(p), "previous content");
  }
}

// The read-back before the rename: a byte the file system changed after the write (the fault seam
// flips it once the file is fsynced) is refused, naming the header or the tensor it belongs to, on
// the small path (hashed after the write) and the threaded one (hashed beside it); the .tmp goes and
// the previous file stays. Without a fault the same views write a shard that reads back whole.
TEST(Shard, AByteTheFileSystemChangedAfterTheWriteIsRefusedByTheReadBackNamingItsTensor) {
  TempDir tmp;
  for (const bool direct : {false, true})
    for (const uint64_t big_size : {uint64_t(1000), uint64_t(10u << 20)}) {
      SCOPED_TRACE(direct ? "past the page cache" : "through the page cache");
      const DirectWrites mode(direct);
      auto a = testing::pattern_bytes(4, 0, 0, 4096);
      auto big = testing::pattern_bytes(5, 0, 0, big_size);
      const std::vector<TensorView> views = {{"big", "U8", {int64_t(big.size())}, big.data(), big.size()},
                                             {"a", "U8", {4096}, a.data(), a.size()},
                                             {"empty", "U8", {0}, nullptr, 0}};
      const std::string p = tmp.file("r" + std::to_string(big_size) + ".safetensors");
      const ShardFileInfo whole = write_shard(p, {{"k", "v"}}, views);
      const ShardData back = read_shard(p);
      ASSERT_EQ(back.tensors.size(), 3u);
      const uint64_t a_at = whole.offsets[1], big_at = whole.offsets[0];
      ASSERT_LT(a_at, big_at);  // sorted by name: a, big, empty
      testing::write_all(p, "previous content");
      const std::vector<std::pair<uint64_t, std::string>> flips = {{3, "the header"},
                                                                   {a_at - 2, "the header"},
                                                                   {a_at, "tensor \"a\""},
                                                                   {big_at + big_size / 2, "tensor \"big\""},
                                                                   {whole.size - 1, "tensor \"big\""}};
      for (const auto& [at, what] : flips) {
        WriteFaults faults;
        faults.flip_byte_at = at;
        try {
          write_shard(p, {{"k", "v"}}, views, faults);
          ADD_FAILURE() << "a flipped byte " << at << " of " << whole.size << " was read back as written";
        } catch (const IntegrityError& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("does not read back as written: " + what), std::string::npos) << at << ": " << msg;
          EXPECT_NE(msg.find(p), std::string::npos) << msg;
        }
        EXPECT_FALSE(std::filesystem::exists(p + ".tmp")) << at;
        EXPECT_EQ(testing::read_all(p), "previous content") << at;
      }
    }
}

// A real ENOSPC from the kernel: the .tmp name is a symlink to /dev/full.
TEST(Shard, RealEnospcFromDevFull) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "past the page cache" : "through the page cache");
    const DirectWrites mode(direct);
    TempDir tmp;
    const std::string p = tmp.file("g.safetensors");
    std::filesystem::create_symlink("/dev/full", p + ".tmp");
    auto data = testing::pattern_bytes(3, 0, 0, 4096);
    try {
      write_shard(p, {}, {{"d", "U8", {4096}, data.data(), 4096}});
      ADD_FAILURE() << "writing to /dev/full succeeded";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(p + ".tmp")));
    EXPECT_FALSE(std::filesystem::exists(p));
  }
}

// Whether a file in `dir` takes a direct write of one aligned block.
bool takes_direct_io(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  bool ok = false;
  if (fd >= 0) {
    void* block = nullptr;
    if (::posix_memalign(&block, 4096, 4096) == 0) {
      std::memset(block, 7, 4096);
      ok = ::write(fd, block, 4096) == 4096;
      std::free(block);
    }
    ::close(fd);
  }
  ::unlink(probe.c_str());
  return ok;
}

// Past the page cache (O_DIRECT through an aligned chunk, the last block padded and the file cut
// back) a shard holds the bytes written through the cache, byte for byte and with the same
// sha256 and offsets, at sizes around the block and the chunk; on tmpfs, which refuses direct
// I/O, it falls back to the cache with the same result.
TEST(Shard, ShardsWrittenPastThePageCacheAreTheBytesWrittenThroughIt) {
  TempDir tmp;
  std::vector<std::string> dirs = {tmp.path()};
  std::string shm = "/dev/shm/retrace-direct-XXXXXX";
  if (std::filesystem::is_directory("/dev/shm") && ::mkdtemp(shm.data()) != nullptr) dirs.push_back(shm);
  struct Gone {
    std::string dir;
    ~Gone() {
      std::error_code ec;
      if (dir.rfind("/dev/shm/", 0) == 0) std::filesystem::remove_all(dir, ec);
    }
  } gone{dirs.back()};
  auto small = testing::pattern_bytes(7, 0, 1, 100);
  for (const std::string& dir : dirs)
    for (const uint64_t n :
         {uint64_t(0), uint64_t(1), uint64_t(4095), uint64_t(4096), uint64_t(4097), uint64_t(8u << 20) - 1,
          uint64_t(8u << 20), uint64_t(8u << 20) + 1, uint64_t(17u << 20) + 3}) {
      SCOPED_TRACE(dir + ", " + std::to_string(n) + " bytes");
      auto big = testing::pattern_bytes(7, 0, 0, n);
      const std::vector<TensorView> views = {{"big", "U8", {int64_t(n)}, n ? big.data() : nullptr, n},
                                             {"small", "U8", {100}, small.data(), 100}};
      ShardFileInfo cached, direct;
      {
        const DirectWrites mode(false);
        cached = write_shard(dir + "/cached.safetensors", {{"k", "v"}}, views);
      }
      {
        const DirectWrites mode(true);
        direct = write_shard(dir + "/direct.safetensors", {{"k", "v"}}, views);
      }
      EXPECT_EQ(direct.sha256, cached.sha256);
      EXPECT_EQ(direct.size, cached.size);
      EXPECT_EQ(direct.offsets, cached.offsets);
      EXPECT_EQ(direct.xxh3, cached.xxh3);
      EXPECT_EQ(std::filesystem::file_size(dir + "/direct.safetensors"), cached.size);
      EXPECT_TRUE(testing::read_all(dir + "/direct.safetensors") == testing::read_all(dir + "/cached.safetensors"));
      EXPECT_EQ(direct.sha256, sha256_file_hex(dir + "/direct.safetensors"));
      EXPECT_FALSE(cached.direct);
      EXPECT_EQ(direct.direct, takes_direct_io(dir)) << "the file system takes direct I/O: so must the writer";
    }
}

}  // namespace
}  // namespace retrace::ckpt
