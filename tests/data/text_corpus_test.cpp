// The byte-level text corpus: windows, vocabulary, file order, symlinks, splits and errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "core/error.h"
#include "data/text_corpus.h"
#include "testing/temp_dir.h"

namespace retrace::data {
namespace {

using testing::TempDir;

void write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string alphabet_text(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + (i * 7) % 26));
  return s;
}

TEST(TextCorpus, WindowsAndTargetsShiftByOne) {
  TempDir dir;
  const std::string text = alphabet_text(100);
  write(dir.file("one.txt"), text);
  const TextCorpus c = load_text_corpus(dir.file("one.txt"), /*context=*/8, /*test_fraction=*/0.2);
  // 100 characters / 9 per window = 11 windows; floor(11 * 0.2) = 2 test windows.
  ASSERT_EQ(c.train_inputs.sizes(), (std::vector<int64_t>{9, 8}));
  ASSERT_EQ(c.train_targets.sizes(), (std::vector<int64_t>{9, 8}));
  ASSERT_EQ(c.test_inputs.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(c.train_inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(c.train_inputs.slice(1, 1, 8), c.train_targets.slice(1, 0, 7)));
  EXPECT_TRUE(torch::equal(c.test_inputs.slice(1, 1, 8), c.test_targets.slice(1, 0, 7)));
  EXPECT_EQ(decode(c, c.train_inputs[0]), text.substr(0, 8));
  EXPECT_EQ(decode(c, c.train_targets[0]), text.substr(1, 8));
  EXPECT_EQ(decode(c, c.train_inputs[1]), text.substr(9, 8));  // non-overlapping windows
  EXPECT_EQ(decode(c, c.test_inputs[0]), text.substr(9 * 9, 8));
  EXPECT_EQ(c.characters, 100);
  ASSERT_EQ(c.files.size(), 1u);
  EXPECT_EQ(c.files[0].size, 100u);
  EXPECT_EQ(c.files[0].sha256.size(), 64u);
}

TEST(TextCorpus, VocabularyIsTheSortedSetOfBytes) {
  TempDir dir;
  write(dir.file("t.txt"), "zebra apple mango zebra apple mango");
  const TextCorpus c = load_text_corpus(dir.file("t.txt"), 4, 0.0);
  const std::string words = "zebra apple mango";
  const std::set<uint8_t> want(words.begin(), words.end());
  EXPECT_EQ(c.vocab, std::vector<uint8_t>(want.begin(), want.end()));
  EXPECT_EQ(c.vocab_size, static_cast<int64_t>(want.size()));
  EXPECT_EQ(c.train_inputs.max().item<int64_t>() < c.vocab_size, true);
  EXPECT_EQ(c.test_inputs.size(0), 0);
}

TEST(TextCorpus, DirectorySortedSymlinksOnceBinarySkipped) {
  TempDir dir;
  write(dir.file("b.txt"), "BBBB");
  write(dir.file("a.txt"), "AAAA");
  write(dir.file("sub/c.txt"), "CCCC");
  write(dir.file("bin.dat"), std::string("xx\0yy", 5));
  std::filesystem::create_symlink(dir.file("a.txt"), dir.file("link.txt"));
  const TextCorpus c = load_text_corpus(dir.path(), 2, 0.0);
  ASSERT_EQ(c.files.size(), 3u);
  EXPECT_EQ(c.files[0].path, dir.file("a.txt"));
  EXPECT_EQ(c.files[1].path, dir.file("b.txt"));
  EXPECT_EQ(c.files[2].path, dir.file("sub/c.txt"));
  EXPECT_EQ(c.characters, 14);  // three files of 4 bytes, two separators
  // "AAAA\nBBBB\nCCCC" in windows of 3 tokens: "AAA", "A\nB", "BBB", "\nCC"; inputs are the first 2.
  EXPECT_EQ(decode(c, c.train_inputs.reshape({-1})), "AAA\nBB\nC");
  EXPECT_EQ(c.vocab, (std::vector<uint8_t>{'\n', 'A', 'B', 'C'}));
}

TEST(TextCorpus, DeterministicAcrossLoads) {
  TempDir dir;
  write(dir.file("x/1.txt"), alphabet_text(300));
  write(dir.file("x/2.txt"), alphabet_text(200));
  const TextCorpus a = load_text_corpus(dir.path(), 16, 0.25);
  const TextCorpus b = load_text_corpus(dir.path(), 16, 0.25);
  EXPECT_TRUE(torch::equal(a.train_inputs, b.train_inputs));
  EXPECT_TRUE(torch::equal(a.train_targets, b.train_targets));
  EXPECT_TRUE(torch::equal(a.test_inputs, b.test_inputs));
  EXPECT_EQ(a.vocab, b.vocab);
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) EXPECT_EQ(a.files[i].sha256, b.files[i].sha256);
  // 501 characters / 17 = 29 windows, floor(29 * 0.25) = 7 test windows.
  EXPECT_EQ(a.train_inputs.size(0), 22);
  EXPECT_EQ(a.test_inputs.size(0), 7);
}

TEST(TextCorpus, DefaultCorpusReadsEachTargetOnce) {
  if (!std::filesystem::exists(kDefaultTextCorpus)) GTEST_SKIP() << kDefaultTextCorpus << " not present";
  const TextCorpus c = load_text_corpus(kDefaultTextCorpus, 128, 0.1);
  EXPECT_GT(c.train_inputs.size(0), 100);
  EXPECT_GT(c.test_inputs.size(0), 0);
  std::set<std::string> targets;
  for (const auto& f : c.files) {
    EXPECT_TRUE(targets.insert(std::filesystem::canonical(f.path).string()).second) << f.path;
  }
}

TEST(TextCorpus, MissingPathIsAnIoErrorNamingIt) {
  try {
    load_text_corpus("/nonexistent/retrace-corpus", 8, 0.1);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/retrace-corpus"), std::string::npos) << e.what();
  }
}

TEST(TextCorpus, TooSmallCorpusSaysWhatItFound) {
  TempDir dir;
  write(dir.file("small.txt"), "abcdefghijk");  // 11 characters, context 8 needs 18
  try {
    load_text_corpus(dir.file("small.txt"), 8, 0.1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("11 characters"), std::string::npos) << m;
    EXPECT_NE(m.find("context 8"), std::string::npos) << m;
  }
  TempDir empty;
  try {
    load_text_corpus(empty.path(), 8, 0.1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("0 characters"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_text_corpus(dir.file("small.txt"), 0, 0.1), ConfigError);
  EXPECT_THROW(load_text_corpus(dir.file("small.txt"), 2, 1.0), ConfigError);
}

}  // namespace
}  // namespace retrace::data
