#include "data/token_files.h"
#include "data/token_header.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/digest.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/le.h"
#include "records/records.h"

namespace retrace::data {
namespace {

namespace stdfs = std::filesystem;

constexpr uint64_t kHeaderBytes = kTokenHeaderInts * 4;
// The hashing pass works through a shard in blocks this large: sha256 and the token check read
// the block while it is in cache.
constexpr uint64_t kPassBlockBytes = 1ull << 20;

constexpr const char* kLayout = kTokenLayout;

// A read-only mapping of a whole file; unmapped when the last copy goes.
class Mapping {
 public:
  Mapping(const std::string& path, uint64_t size) : size_(size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    RETRACE_CHECK(fd >= 0, IoError, "cannot open token shard ", path, ": ", fs::errno_text(errno));
    void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    const int map_errno = errno;
    ::close(fd);
    RETRACE_CHECK(p != MAP_FAILED, IoError, "cannot map token shard ", path, " (", size,
                  " bytes): ", fs::errno_text(map_errno));
    data_ = static_cast<const unsigned char*>(p);
  }
  ~Mapping() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  void advise(int advice) const {
    if (data_) ::madvise(const_cast<unsigned char*>(data_), size_, advice);
  }

 private:
  const unsigned char* data_ = nullptr;
  uint64_t size_;
};

struct Shard {
  std::string path;
  std::shared_ptr<const Mapping> map;
  uint32_t width = 2;  // bytes per token
  uint64_t tokens = 0;
  uint64_t windows = 0;
  uint64_t first_window = 0;  // windows of the shards before it
  records::FileInfo info;
};

// The largest of n tokens at p. The tokens start 1024 bytes into a page-aligned mapping, so p is
// aligned for T; a plain loop over T in the host's order vectorizes (the pass must keep up with
// sha256), and the host's order is the files' (little-endian; token_at is order-independent).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "max_token reads little-endian tokens natively");
template <typename T>
uint32_t max_token(const unsigned char* p, uint64_t n) {
  const T* t = reinterpret_cast<const T*>(p);
  T m = 0;
  for (uint64_t i = 0; i < n; ++i) m = t[i] > m ? t[i] : m;
  return static_cast<uint32_t>(m);
}

uint32_t token_at(const unsigned char* p, uint32_t width, uint64_t i) {
  const unsigned char* q = p + i * width;
  return width == 2 ? get_u16(q) : get_u32(q);
}

// Checks the shard's header and size, maps it, then hashes its bytes and checks every token
// against `vocab` (0: no check) in one pass, raising `largest` to the shard's largest token.
Shard open_shard(const std::string& path, uint32_t& largest, int64_t vocab) {
  Shard s;
  s.path = path;
  std::error_code ec;
  const auto link = stdfs::symlink_status(path, ec);
  const auto st = stdfs::status(path, ec);
  RETRACE_CHECK(!(stdfs::is_symlink(link) && !stdfs::exists(st)), IoError, "token shard ", path,
                " is a symbolic link to a file that does not exist; restore the file or remove the link");
  RETRACE_CHECK(!stdfs::is_directory(st), IoError, "token shard ", path,
                " is a directory, not a token file; rename or move it out of the data directory");
  RETRACE_CHECK(stdfs::is_regular_file(st), IoError, "token shard ", path, " is not a regular file");
  const uint64_t file_size = stdfs::file_size(path, ec);
  RETRACE_CHECK(!ec, IoError, "cannot stat token shard ", path, ": ", ec.message());
  RETRACE_CHECK(::access(path.c_str(), R_OK) == 0, IoError, "cannot read token shard ", path, ": ",
                fs::errno_text(errno), "; check its permissions");
  RETRACE_CHECK(file_size >= kHeaderBytes, FormatError, "token shard ", path, " is ", file_size,
                " bytes, shorter than the ", kHeaderBytes,
                "-byte header of an llm.c token file; the file is truncated or not a token file (", kLayout, ")");
  s.map = std::make_shared<Mapping>(path, file_size);
  const unsigned char* h = s.map->data();
  const TokenHeader header = check_token_header(h, file_size, path);
  s.width = header.width;
  const uint64_t count = header.tokens;
  s.tokens = count;

  // One pass: sha256 of every byte, and the tokens' range, block by block.
  s.map->advise(MADV_SEQUENTIAL);
  Sha256 sha;
  uint32_t top = 0;
  for (uint64_t at = 0; at < file_size; at += kPassBlockBytes) {
    const uint64_t n = std::min(kPassBlockBytes, file_size - at);
    sha.update(h + at, n);
    const uint64_t begin = std::max(at, kHeaderBytes);
    if (begin >= at + n) continue;
    const uint64_t count_here = (at + n - begin) / s.width;
    const uint32_t m = s.width == 2 ? max_token<uint16_t>(h + begin, count_here)
                                    : max_token<uint32_t>(h + begin, count_here);
    if (vocab > 0 && m >= static_cast<uint64_t>(vocab)) {
      uint64_t i = (begin - kHeaderBytes) / s.width;
      while (token_at(h + kHeaderBytes, s.width, i) < static_cast<uint64_t>(vocab)) ++i;
      RETRACE_FAIL(ConfigError, "token shard ", path, ": token ", token_at(h + kHeaderBytes, s.width, i),
                   " at position ", i, " (byte offset ", kHeaderBytes + s.width * i, ") is >= data.vocab_size ", vocab,
                   "; give the vocabulary the tokenizer used (50257 for GPT-2), or 0 to take the largest "
                   "token + 1");
    }
    top = std::max(top, m);
  }
  s.map->advise(MADV_RANDOM);  // from now on only windows are read
  largest = std::max(largest, top);
  s.info.path = path;
  s.info.size = file_size;
  s.info.sha256 = sha.finish_hex();
  return s;
}

// A split's windows over its shards.
class TokenWindows : public SampleSource {
 public:
  TokenWindows(std::vector<Shard> shards, int64_t context) : shards_(std::move(shards)), context_(context) {
    uint64_t total = 0;
    for (Shard& s : shards_) {
      s.windows = s.tokens / static_cast<uint64_t>(context + 1);
      s.first_window = total;
      total += s.windows;
    }
    windows_ = static_cast<int64_t>(total);
  }
  int64_t size() const override { return windows_; }

  Samples gather(const std::vector<int64_t>& indices) const override {
    Samples out = allocate(static_cast<int64_t>(indices.size()));
    for (size_t row = 0; row < indices.size(); ++row) copy_window(indices[row], static_cast<int64_t>(row), out);
    return out;
  }
  Samples range(int64_t begin, int64_t end) const override {
    RETRACE_CHECK(0 <= begin && begin <= end && end <= windows_, InvariantError, "token windows [", begin, ", ", end,
                  ") outside [0, ", windows_, ")");
    Samples out = allocate(end - begin);
    for (int64_t i = begin; i < end; ++i) copy_window(i, i - begin, out);
    return out;
  }

 private:
  Samples allocate(int64_t rows) const {
    return {torch::empty({rows, context_}, torch::kLong), torch::empty({rows, context_}, torch::kLong)};
  }
  void copy_window(int64_t index, int64_t row, Samples& out) const {
    RETRACE_CHECK(index >= 0 && index < windows_, InvariantError, "token window ", index, " outside [0, ", windows_,
                  ")");
    const uint64_t w = static_cast<uint64_t>(index);
    // The last shard whose first window is <= w.
    const auto it = std::upper_bound(shards_.begin(), shards_.end(), w,
                                     [](uint64_t v, const Shard& s) { return v < s.first_window; }) -
                    1;
    const uint64_t first = (w - it->first_window) * static_cast<uint64_t>(context_ + 1);
    const unsigned char* tokens = it->map->data() + kHeaderBytes;
    int64_t* in = out.inputs.data_ptr<int64_t>() + row * context_;
    int64_t* tg = out.targets.data_ptr<int64_t>() + row * context_;
    uint32_t prev = token_at(tokens, it->width, first);
    for (int64_t j = 0; j < context_; ++j) {
      const uint32_t next = token_at(tokens, it->width, first + static_cast<uint64_t>(j) + 1);
      in[j] = prev;
      tg[j] = next;
      prev = next;
    }
  }

  std::vector<Shard> shards_;
  int64_t context_;
  int64_t windows_ = 0;
};

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

Dataset load_token_files(const std::string& dir, int64_t context, int64_t vocab_size) {
  RETRACE_CHECK(context >= 1, ConfigError, "bad value for data.context: ", context, " (need >= 1)");
  RETRACE_CHECK(vocab_size >= 0, ConfigError, "bad value for data.vocab_size: ", vocab_size,
                " (need >= 0; 0 takes the largest token + 1)");
  std::error_code ec;
  RETRACE_CHECK(stdfs::exists(dir, ec), IoError, "token data directory not found: ", dir, "; ", kLayout);
  RETRACE_CHECK(stdfs::is_directory(dir, ec), IoError, "token data path ", dir, " is not a directory; ", kLayout);

  std::vector<std::string> train_paths, val_paths;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0) continue;
    const bool train = contains(name, "train"), val = contains(name, "val");
    RETRACE_CHECK(!(train && val), ConfigError, "token shard ", it->path().string(),
                  " has both \"train\" and \"val\" "
                  "in its name, so it is unclear which split it belongs to; rename it");
    if (train) train_paths.push_back(it->path().string());
    if (val) val_paths.push_back(it->path().string());
  }
  RETRACE_CHECK(!ec, IoError, "cannot list token data directory ", dir, ": ", ec.message());
  RETRACE_CHECK(!train_paths.empty(), IoError, "no training shard in ", dir, " (no file named *train*.bin); ", kLayout);
  RETRACE_CHECK(!val_paths.empty(), IoError, "no validation shard in ", dir, " (no file named *val*.bin); ", kLayout);
  std::sort(train_paths.begin(), train_paths.end());
  std::sort(val_paths.begin(), val_paths.end());

  uint32_t largest = 0;
  std::vector<Shard> train, val;
  Dataset d;
  for (const auto& [paths, out] : {std::pair{&train_paths, &train}, std::pair{&val_paths, &val}}) {
    for (const std::string& p : *paths) {
      out->push_back(open_shard(p, largest, vocab_size));
      const Shard& s = out->back();
      const Shard& first = train.empty() ? s : train.front();
      RETRACE_CHECK(s.width == first.width, ConfigError, "token shards of two formats in ", dir, ": ", first.path,
                    " holds ", first.width == 2 ? "uint16 (GPT-2)" : "uint32 (LLaMA-3)", " tokens but ", s.path,
                    " holds ", s.width == 2 ? "uint16 (GPT-2)" : "uint32 (LLaMA-3)",
                    " tokens; one data set takes one tokenizer's shards: move the others out");
      RETRACE_CHECK(s.tokens > static_cast<uint64_t>(context), ConfigError, "token shard ", s.path, " holds ", s.tokens,
                    " tokens, fewer than one window of data.context ", context, " + 1 = ", context + 1,
                    " tokens; use a smaller data.context, or remove the shard");
      d.files.push_back(s.info);
    }
  }
  const uint32_t width = train.front().width;
  uint64_t train_tokens = 0, val_tokens = 0;
  for (const Shard& s : train) train_tokens += s.tokens;
  for (const Shard& s : val) val_tokens += s.tokens;
  const size_t train_shards = train.size(), val_shards = val.size();
  auto train_windows = std::make_shared<TokenWindows>(std::move(train), context);
  auto val_windows = std::make_shared<TokenWindows>(std::move(val), context);
  d.train.source = train_windows;
  d.test.source = val_windows;
  d.vocab_size = vocab_size > 0 ? vocab_size : static_cast<int64_t>(largest) + 1;
  std::ostringstream desc;
  desc << "llm.c token shards " << dir << ": " << train_windows->size() << " train / " << val_windows->size()
       << " validation windows of context " << context << " (" << train_tokens << " tokens in " << train_shards
       << " shard" << (train_shards == 1 ? "" : "s") << " + " << val_tokens << " in " << val_shards << "), "
       << (width == 2 ? "uint16" : "uint32") << " tokens, vocabulary " << d.vocab_size;
  d.description = desc.str();
  return d;
}

}  // namespace retrace::data
