#include "data/text_corpus.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <system_error>

#include "core/digest.h"
#include "core/error.h"

namespace retrace::data {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  RETRACE_CHECK(in.good(), IoError, "cannot open text corpus file ", path.string());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RETRACE_CHECK(!in.bad(), IoError, "cannot read text corpus file ", path.string());
  return bytes;
}

// The regular files to read, in sorted order, each target once.
std::vector<fs::path> list_files(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {root};
  std::vector<fs::path> all;
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec);
  RETRACE_CHECK(!ec, IoError, "cannot list text corpus directory ", root.string(), ": ", ec.message());
  for (const fs::recursive_directory_iterator end; it != end; it.increment(ec)) {
    RETRACE_CHECK(!ec, IoError, "cannot list text corpus directory ", root.string(), ": ", ec.message());
    std::error_code file_ec;
    if (fs::is_regular_file(it->path(), file_ec)) all.push_back(it->path());  // follows links
  }
  RETRACE_CHECK(!ec, IoError, "cannot list text corpus directory ", root.string(), ": ", ec.message());
  std::sort(all.begin(), all.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  std::vector<fs::path> unique;
  std::set<std::string> seen;
  for (const auto& p : all) {
    std::error_code canon_ec;
    fs::path target = fs::canonical(p, canon_ec);
    RETRACE_CHECK(!canon_ec, IoError, "cannot resolve text corpus file ", p.string(), ": ", canon_ec.message());
    if (seen.insert(target.string()).second) unique.push_back(p);
  }
  return unique;
}

}  // namespace

TextCorpus load_text_corpus(const std::string& path_or_dir, int64_t context, double test_fraction) {
  RETRACE_CHECK(context >= 1, ConfigError, "bad value for model.context: ", context, " (need >= 1)");
  RETRACE_CHECK(test_fraction >= 0.0 && test_fraction < 1.0, ConfigError,
                "bad value for data.test_fraction: ", test_fraction, " (need 0 <= test_fraction < 1)");
  std::error_code ec;
  RETRACE_CHECK(fs::exists(path_or_dir, ec), IoError, "text corpus not found: ", path_or_dir,
                " (give a text file or a directory of text files)");

  TextCorpus corpus;
  std::string text;
  int64_t skipped = 0;
  for (const auto& path : list_files(path_or_dir)) {
    std::string bytes = read_file(path);
    if (bytes.find('\0') != std::string::npos) {
      ++skipped;
      continue;
    }
    if (!corpus.files.empty()) text.push_back('\n');
    text += bytes;
    records::FileInfo info;
    info.path = path.string();
    info.size = bytes.size();
    info.sha256 = sha256_hex(bytes.data(), bytes.size());
    corpus.files.push_back(std::move(info));
  }
  corpus.characters = static_cast<int64_t>(text.size());
  const int64_t window = context + 1;
  const int64_t windows = corpus.characters / window;
  RETRACE_CHECK(windows >= 2, ConfigError, "text corpus ", path_or_dir, " has ", corpus.characters, " characters in ",
                corpus.files.size(), " text files (", skipped, " binary files skipped); context ", context,
                " needs at least ", 2 * window, " for two windows of context + 1 tokens");

  std::array<int64_t, 256> token_of{};
  token_of.fill(-1);
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<uint8_t>(c)] = true;
  for (int byte = 0; byte < 256; ++byte) {
    if (!present[byte]) continue;
    token_of[byte] = static_cast<int64_t>(corpus.vocab.size());
    corpus.vocab.push_back(static_cast<uint8_t>(byte));
  }
  corpus.vocab_size = static_cast<int64_t>(corpus.vocab.size());

  torch::Tensor tokens = torch::empty({windows, window}, torch::kLong);
  int64_t* out = tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < windows * window; ++i) out[i] = token_of[static_cast<uint8_t>(text[static_cast<size_t>(i)])];

  int64_t n_test = static_cast<int64_t>(std::floor(static_cast<double>(windows) * test_fraction));
  if (test_fraction > 0.0) n_test = std::clamp<int64_t>(n_test, 1, windows - 1);
  const int64_t n_train = windows - n_test;
  torch::Tensor inputs = tokens.slice(/*dim=*/1, 0, context);
  torch::Tensor targets = tokens.slice(/*dim=*/1, 1, window);
  corpus.train_inputs = inputs.slice(0, 0, n_train).contiguous();
  corpus.train_targets = targets.slice(0, 0, n_train).contiguous();
  corpus.test_inputs = inputs.slice(0, n_train, windows).contiguous();
  corpus.test_targets = targets.slice(0, n_train, windows).contiguous();
  return corpus;
}

std::string decode(const TextCorpus& corpus, const torch::Tensor& tokens) {
  torch::Tensor flat = tokens.to(torch::kLong).contiguous().view({-1});
  const int64_t* p = flat.data_ptr<int64_t>();
  std::string out;
  out.reserve(static_cast<size_t>(flat.numel()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    RETRACE_CHECK(p[i] >= 0 && p[i] < corpus.vocab_size, ConfigError, "token ", p[i], " is outside the vocabulary of ",
                  corpus.vocab_size);
    out.push_back(static_cast<char>(corpus.vocab[static_cast<size_t>(p[i])]));
  }
  return out;
}

}  // namespace retrace::data
