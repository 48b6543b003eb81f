#include "data/token_files.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/digest.h"
#include "core/error.h"
#include "records/records.h"

namespace retrace::data {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHeaderBytes = kTokenHeaderInts * 4;
constexpr uint64_t kReadChunkBytes = 64ull << 20;  // large reads: 64 MiB at a time

constexpr const char* kLayout =
    "expected a directory holding train.bin and val.bin in llm.c's token format (a header of 256 "
    "little-endian int32: 20240520, 1, token count; then the uint16 tokens); tools/data/write_tokens.py "
    "writes one from a text file";

struct TokenFile {
  std::string path;
  std::vector<uint16_t> tokens;
  records::FileInfo info;
};

int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

TokenFile read_token_file(const fs::path& dir, const char* name) {
  TokenFile out;
  out.path = (dir / name).string();
  std::error_code ec;
  RETRACE_CHECK(fs::is_regular_file(out.path, ec), IoError, "token file missing: ", out.path, "; ", kLayout);
  const uint64_t file_size = fs::file_size(out.path, ec);
  RETRACE_CHECK(!ec, IoError, "cannot stat token file ", out.path, ": ", ec.message());
  std::ifstream in(out.path, std::ios::binary);
  RETRACE_CHECK(in.good(), IoError, "cannot open token file ", out.path);

  RETRACE_CHECK(file_size >= kHeaderBytes, FormatError, "token file ", out.path, " is ", file_size,
                " bytes, shorter than the ", kHeaderBytes,
                "-byte header of an llm.c token file; the file is truncated or not a token file (", kLayout, ")");
  std::array<unsigned char, kHeaderBytes> header{};
  in.read(reinterpret_cast<char*>(header.data()), static_cast<std::streamsize>(kHeaderBytes));
  RETRACE_CHECK(static_cast<uint64_t>(in.gcount()) == kHeaderBytes, IoError, "cannot read the header of token file ",
                out.path);
  Sha256 sha;
  sha.update(header.data(), header.size());

  const int32_t magic = le_i32(header.data());
  const int32_t version = le_i32(header.data() + 4);
  const int32_t count = le_i32(header.data() + 8);
  RETRACE_CHECK(magic == kTokenFileMagic, FormatError, "token file ", out.path, ": header[0] (magic) is ", magic,
                ", expected ", kTokenFileMagic, "; this is not an llm.c token file (", kLayout, ")");
  RETRACE_CHECK(version == kTokenFileVersion, FormatError, "token file ", out.path, ": header[1] (version) is ",
                version, ", expected ", kTokenFileVersion, " (uint16 tokens)",
                version == 2 ? "; version 2 (uint32 tokens, e.g. LLaMA 3) is not supported" : "");
  RETRACE_CHECK(count >= 0, FormatError, "token file ", out.path, ": header[2] (token count) is ", count,
                ", expected a count >= 0; the header is damaged");
  const uint64_t expected_size = kHeaderBytes + 2 * static_cast<uint64_t>(count);
  RETRACE_CHECK(file_size == expected_size, FormatError, "token file ", out.path, ": header[2] says ", count,
                " tokens, which need ", expected_size, " bytes, but the file has ", file_size, " bytes (room for ",
                (file_size - kHeaderBytes) / 2, " tokens); the file is ",
                file_size < expected_size ? "truncated" : "longer than its header says");

  out.tokens.resize(static_cast<size_t>(count));
  char* dst = reinterpret_cast<char*>(out.tokens.data());
  const uint64_t total = 2 * static_cast<uint64_t>(count);
  for (uint64_t done = 0; done < total;) {
    const uint64_t want = std::min(kReadChunkBytes, total - done);
    in.read(dst + done, static_cast<std::streamsize>(want));
    const uint64_t got = static_cast<uint64_t>(in.gcount());
    RETRACE_CHECK(got == want, IoError, "cannot read token file ", out.path, ": got ", done + got, " of ", total,
                  " token bytes (did the file change while it was read?)");
    sha.update(dst + done, got);
    done += got;
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (uint16_t& t : out.tokens) t = static_cast<uint16_t>((t >> 8) | (t << 8));
#endif
  out.info.path = out.path;
  out.info.size = file_size;
  out.info.sha256 = sha.finish_hex();
  return out;
}

// Non-overlapping windows of context + 1 tokens: inputs window[:-1], targets window[1:].
Split make_windows(const TokenFile& f, int64_t context) {
  const int64_t n = static_cast<int64_t>(f.tokens.size());
  RETRACE_CHECK(n > context, ConfigError, "token file ", f.path, " holds ", n, " tokens; context ", context,
                " needs at least ", context, " + 1 = ", context + 1,
                " tokens for one window (use a smaller model.context or a longer file)");
  const int64_t window = context + 1;
  const int64_t windows = n / window;
  Split s;
  s.inputs = torch::empty({windows, context}, torch::kLong);
  s.targets = torch::empty({windows, context}, torch::kLong);
  int64_t* in = s.inputs.data_ptr<int64_t>();
  int64_t* tg = s.targets.data_ptr<int64_t>();
  const uint16_t* tok = f.tokens.data();
  for (int64_t w = 0; w < windows; ++w) {
    const uint16_t* src = tok + w * window;
    int64_t* in_row = in + w * context;
    int64_t* tg_row = tg + w * context;
    for (int64_t j = 0; j < context; ++j) {
      in_row[j] = src[j];
      tg_row[j] = src[j + 1];
    }
  }
  return s;
}

}  // namespace

Dataset load_token_files(const std::string& dir, int64_t context, int64_t vocab_size) {
  RETRACE_CHECK(context >= 1, ConfigError, "bad value for model.context: ", context, " (need >= 1)");
  RETRACE_CHECK(vocab_size >= 0, ConfigError, "bad vocab_size for token files: ", vocab_size,
                " (need >= 0; 0 takes the largest token + 1)");
  std::error_code ec;
  RETRACE_CHECK(fs::exists(dir, ec), IoError, "token file directory not found: ", dir, "; ", kLayout);
  RETRACE_CHECK(fs::is_directory(dir, ec), IoError, "token file path ", dir, " is not a directory; ", kLayout);

  const TokenFile train = read_token_file(dir, kTokenTrainFile);
  const TokenFile val = read_token_file(dir, kTokenValFile);

  int64_t vocab = vocab_size;
  if (vocab == 0) {
    for (const TokenFile* f : {&train, &val}) {
      if (!f->tokens.empty()) vocab = std::max<int64_t>(vocab, *std::max_element(f->tokens.begin(), f->tokens.end()) + 1);
    }
  } else {
    for (const TokenFile* f : {&train, &val}) {
      const auto bad = std::find_if(f->tokens.begin(), f->tokens.end(), [&](uint16_t t) { return t >= vocab; });
      if (bad == f->tokens.end()) continue;
      const int64_t pos = bad - f->tokens.begin();
      RETRACE_FAIL(ConfigError, "token file ", f->path, ": token ", *bad, " at position ", pos, " (byte offset ",
                   kHeaderBytes + 2 * static_cast<uint64_t>(pos), ") is >= vocab_size ", vocab,
                   "; give the vocabulary the tokenizer used, or 0 to take the largest token + 1");
    }
  }

  Dataset d;
  d.train = make_windows(train, context);
  d.test = make_windows(val, context);
  d.vocab_size = vocab;
  d.files = {train.info, val.info};
  std::ostringstream desc;
  desc << "llm.c token files " << dir << ": " << d.train.size() << " train / " << d.test.size()
       << " test windows of context " << context << " (" << train.tokens.size() << " + " << val.tokens.size()
       << " tokens), vocabulary " << vocab;
  d.description = desc.str();
  return d;
}

}  // namespace retrace::data
