// llm.c token shards: both formats, windows within shards, memory mapping, data identity, and
// every bad input the loader must name. Every fixture is written here, in a temporary directory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/error.h"
#include "data/token_files.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"

namespace retrace::data {
namespace {

using testing::TempDir;

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected \"" << (needle) << "\" in: " << (haystack)

void put_i32(std::string& out, size_t at, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((u >> (8 * i)) & 0xff);
}

// An llm.c token file; the header says `count` tokens (by default the true number). width 2 is
// GPT-2's format (uint16 tokens), 4 LLaMA-3's (uint32).
void write_tokens(const std::string& path, const std::vector<uint32_t>& tokens, int width = 2,
                  std::optional<int32_t> magic = std::nullopt, std::optional<int32_t> version = std::nullopt,
                  std::optional<int32_t> count = std::nullopt) {
  std::string bytes(1024, '\0');
  put_i32(bytes, 0, magic ? *magic : width == 2 ? kTokenMagicGpt2 : kTokenMagicLlama3);
  put_i32(bytes, 4, version ? *version : width == 2 ? kTokenVersionGpt2 : kTokenVersionLlama3);
  put_i32(bytes, 8, count ? *count : static_cast<int32_t>(tokens.size()));
  for (uint32_t t : tokens)
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<uint32_t> iota_tokens(int n, uint32_t start = 0) {
  std::vector<uint32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(start + static_cast<uint32_t>(i));
  return v;
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t i) {
  const torch::Tensor r = t[i].contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

TEST(TokenShards, WindowsShiftTargetsByOne) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(27, 1000));  // 27 tokens / 5 = 5 windows, 2 dropped
  write_tokens(dir.file("val.bin"), iota_tokens(11, 40000));   // 2 windows, 1 dropped
  const Dataset d = load_token_files(dir.path(), /*context=*/4, /*vocab_size=*/0);
  ASSERT_EQ(d.train.size(), 5);
  ASSERT_EQ(d.test.size(), 2);
  EXPECT_FALSE(d.train.inputs.defined());  // nothing materialized: read from the mapping
  const Samples all = d.train.range(0, 5);
  ASSERT_EQ(all.inputs.sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(all.inputs.scalar_type(), torch::kLong);
  EXPECT_EQ(row(all.inputs, 0), (std::vector<int64_t>{1000, 1001, 1002, 1003}));
  EXPECT_EQ(row(all.targets, 0), (std::vector<int64_t>{1001, 1002, 1003, 1004}));
  EXPECT_EQ(row(all.inputs, 1), (std::vector<int64_t>{1005, 1006, 1007, 1008}));
  EXPECT_EQ(row(d.test.range(1, 2).targets, 0), (std::vector<int64_t>{40006, 40007, 40008, 40009}));
  EXPECT_EQ(d.vocab_size, 40011);  // the largest token of every shard + 1 (40010 is in the dropped tail)
  ASSERT_EQ(d.files.size(), 2u);
  EXPECT_EQ(d.files[0].path, dir.file("train.bin"));
  EXPECT_EQ(d.files[1].path, dir.file("val.bin"));
  for (const auto& f : d.files) {
    EXPECT_EQ(f.size, std::filesystem::file_size(f.path)) << f.path;
    EXPECT_EQ(f.sha256, sha256_file_hex(f.path)) << f.path;
  }
  // gather: any order, repeats allowed, the same rows as range.
  const Samples g = d.train.gather({4, 0, 4});
  EXPECT_EQ(row(g.inputs, 0), row(all.inputs, 4));
  EXPECT_EQ(row(g.inputs, 1), row(all.inputs, 0));
  EXPECT_EQ(row(g.targets, 2), row(all.targets, 4));
  EXPECT_EQ(load_token_files(dir.path(), 4, 50257).vocab_size, 50257);
}

TEST(TokenShards, ShardsInNameOrderWindowsNeverCrossABoundary) {
  TempDir dir;
  // Three train shards written out of order; 11, 7 and 5 tokens at context 4 give 2, 1 and 1
  // windows (tails of 1, 2 and 0 tokens dropped at each shard's end).
  write_tokens(dir.file("fineweb_train_000002.bin"), iota_tokens(7, 200));
  write_tokens(dir.file("fineweb_train_000001.bin"), iota_tokens(11, 100));
  write_tokens(dir.file("fineweb_train_000003.bin"), iota_tokens(5, 300));
  write_tokens(dir.file("fineweb_val_000000.bin"), iota_tokens(5, 900));
  std::ofstream(dir.file("notes.txt")) << "not a shard";
  std::ofstream(dir.file("other.bin")) << "neither train nor val: ignored";
  const Dataset d = load_token_files(dir.path(), 4, 0);
  ASSERT_EQ(d.train.size(), 4);
  const Samples s = d.train.range(0, 4);
  EXPECT_EQ(row(s.inputs, 0), (std::vector<int64_t>{100, 101, 102, 103}));
  EXPECT_EQ(row(s.inputs, 1), (std::vector<int64_t>{105, 106, 107, 108}));
  EXPECT_EQ(row(s.targets, 1), (std::vector<int64_t>{106, 107, 108, 109}));
  EXPECT_EQ(row(s.inputs, 2), (std::vector<int64_t>{200, 201, 202, 203}));  // not 110, 200, ...
  EXPECT_EQ(row(s.inputs, 3), (std::vector<int64_t>{300, 301, 302, 303}));
  ASSERT_EQ(d.files.size(), 4u);
  EXPECT_EQ(d.files[0].path, dir.file("fineweb_train_000001.bin"));
  EXPECT_EQ(d.files[2].path, dir.file("fineweb_train_000003.bin"));
  EXPECT_EQ(d.files[3].path, dir.file("fineweb_val_000000.bin"));
  EXPECT_CONTAINS(d.description, "3 shards");
}

TEST(TokenShards, Llama3FormatReadsUint32Tokens) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(10, 128000), /*width=*/4);
  write_tokens(dir.file("val.bin"), iota_tokens(5, 70000), 4);
  const Dataset d = load_token_files(dir.path(), 4, 128256);
  EXPECT_EQ(row(d.train.range(1, 2).inputs, 0), (std::vector<int64_t>{128005, 128006, 128007, 128008}));
  EXPECT_EQ(d.files[0].size, 1024u + 4 * 10);
  EXPECT_CONTAINS(d.description, "uint32");
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 128000); });
  EXPECT_CONTAINS(m, "token 128000 at position 0");
}

TEST(TokenShards, MixedFormatsAreRefused) {
  TempDir dir;
  write_tokens(dir.file("a_train.bin"), iota_tokens(10), 2);
  write_tokens(dir.file("b_train.bin"), iota_tokens(10), 4);
  write_tokens(dir.file("val.bin"), iota_tokens(10), 2);
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, "two formats");
  EXPECT_CONTAINS(m, dir.file("b_train.bin"));
}

TEST(TokenShards, BadHeadersAreFormatErrorsNamingTheShard) {
  TempDir dir;
  write_tokens(dir.file("val.bin"), iota_tokens(20));
  write_tokens(dir.file("train.bin"), iota_tokens(20), 2, /*magic=*/20240521);
  std::string m = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, dir.file("train.bin"));
  EXPECT_CONTAINS(m, "magic) is 20240521, expected 20240520");
  write_tokens(dir.file("train.bin"), iota_tokens(20), 2, kTokenMagicGpt2, /*version=*/2);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }),
                  "version) is 2 with the GPT-2 magic");
  write_tokens(dir.file("train.bin"), iota_tokens(20), 4, kTokenMagicLlama3, /*version=*/1);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }),
                  "version) is 1 with the LLaMA-3 magic");
  // A count that disagrees with the size: truncated, longer, negative.
  write_tokens(dir.file("train.bin"), iota_tokens(50), 2, std::nullopt, std::nullopt, /*count=*/100);
  m = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, "100 tokens of 2 bytes, which need 1224 bytes, but the file has 1124 bytes");
  EXPECT_CONTAINS(m, "truncated");
  write_tokens(dir.file("train.bin"), iota_tokens(50), 2, std::nullopt, std::nullopt, 10);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }),
                  "longer than its header says");
  write_tokens(dir.file("train.bin"), iota_tokens(50), 2, std::nullopt, std::nullopt, -5);
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }), "is -5");
  // Shorter than its header; zero tokens.
  std::ofstream(dir.file("train.bin"), std::ios::binary | std::ios::trunc) << std::string(100, '\0');
  EXPECT_CONTAINS(testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); }), "is 100 bytes");
  write_tokens(dir.file("train.bin"), {});
  m = testing::error_of<FormatError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, "holds no tokens");
  EXPECT_CONTAINS(m, dir.file("train.bin"));
}

TEST(TokenShards, TokenOutsideTheVocabularyNamesShardPositionAndToken) {
  TempDir dir;
  std::vector<uint32_t> val = iota_tokens(20);
  val[13] = 256;
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  write_tokens(dir.file("val.bin"), val);
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 256); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "token 256 at position 13 (byte offset 1050)");
  EXPECT_CONTAINS(m, "data.vocab_size 256");
  EXPECT_EQ(load_token_files(dir.path(), 4, 257).vocab_size, 257);
  // A bad token in a later block of a large shard: found in the same single pass.
  std::vector<uint32_t> big(3 << 19, 7);  // 3 MiB of uint16 tokens: three pass blocks
  big[(5 << 18) + 3] = 60000;
  write_tokens(dir.file("train.bin"), big);
  EXPECT_CONTAINS(testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 50257); }),
                  "token 60000 at position " + std::to_string((5 << 18) + 3));
}

TEST(TokenShards, ShardShorterThanAWindowSaysHowManyAndTheContext) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(100));
  write_tokens(dir.file("val.bin"), iota_tokens(8));
  const std::string m = testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 8, 0); });
  EXPECT_CONTAINS(m, dir.file("val.bin"));
  EXPECT_CONTAINS(m, "8 tokens");
  EXPECT_CONTAINS(m, "data.context 8 + 1 = 9");
  EXPECT_EQ(load_token_files(dir.path(), 7, 0).test.size(), 1);  // exactly one window of 8
}

TEST(TokenShards, MissingSplitsAndOddEntriesAreIoErrors) {
  EXPECT_CONTAINS(testing::error_of<IoError>([] { load_token_files("/nonexistent/retrace-tokens", 4, 0); }),
                  "/nonexistent/retrace-tokens");
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  std::string m = testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, "no validation shard in " + dir.path());
  EXPECT_CONTAINS(m, "*val*.bin");
  std::filesystem::rename(dir.file("train.bin"), dir.file("val.bin"));
  EXPECT_CONTAINS(testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); }), "no training shard");
  write_tokens(dir.file("train.bin"), iota_tokens(20));
  // A directory named like a shard, a dangling link.
  std::filesystem::create_directory(dir.file("more_train.bin"));
  m = testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, dir.file("more_train.bin"));
  EXPECT_CONTAINS(m, "is a directory");
  std::filesystem::remove(dir.file("more_train.bin"));
  std::filesystem::create_symlink(dir.file("gone.bin"), dir.file("more_train.bin"));
  m = testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); });
  EXPECT_CONTAINS(m, "symbolic link to a file that does not exist");
  std::filesystem::remove(dir.file("more_train.bin"));
  // A name that matches both splits.
  write_tokens(dir.file("train_val.bin"), iota_tokens(20));
  EXPECT_CONTAINS(testing::error_of<ConfigError>([&] { load_token_files(dir.path(), 4, 0); }),
                  "both \"train\" and \"val\"");
  std::filesystem::remove(dir.file("train_val.bin"));
  // Unreadable: only without root's override of permissions.
  if (::geteuid() != 0) {
    std::filesystem::permissions(dir.file("val.bin"), std::filesystem::perms::none);
    EXPECT_CONTAINS(testing::error_of<IoError>([&] { load_token_files(dir.path(), 4, 0); }), "cannot read");
    std::filesystem::permissions(dir.file("val.bin"), std::filesystem::perms::owner_all);
  }
  EXPECT_THROW(load_token_files(dir.path(), 0, 0), ConfigError);
  EXPECT_THROW(load_token_files(dir.path(), 4, -1), ConfigError);
}

// Anonymous memory (RssAnon of /proc/self/status) in KiB.
int64_t anonymous_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  return -1;
}

TEST(TokenShards, DataStaysOutOfAnonymousMemory) {
  TempDir dir;
  // 48M tokens (96 MB) in two train shards; a copy as int64 windows would be 768 MB.
  const std::vector<uint32_t> tokens(24 << 20, 11);
  write_tokens(dir.file("a_train.bin"), tokens);
  write_tokens(dir.file("b_train.bin"), tokens);
  write_tokens(dir.file("val.bin"), iota_tokens(2048));
  const int64_t before = anonymous_kib();
  const Dataset d = load_token_files(dir.path(), 1023, 50257);
  const Samples batch = d.train.gather({0, d.train.size() - 1, d.train.size() / 2});
  const int64_t after = anonymous_kib();
  EXPECT_EQ(d.train.size(), 2 * ((24 << 20) / 1024));
  EXPECT_EQ(row(batch.targets, 1)[5], 11);
  // The mapping and the hashing pass are file-backed; what grows is a few records and a batch.
  EXPECT_LT(after - before, 16 * 1024) << "anonymous memory grew by " << after - before << " KiB";
}

}  // namespace
}  // namespace retrace::data
