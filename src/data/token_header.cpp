#include "data/token_header.h"

#include "core/error.h"
#include "core/le.h"

namespace retrace::data {

namespace {
constexpr int32_t kMagicGpt2 = kTokenMagicGpt2, kVersionGpt2 = kTokenVersionGpt2;
constexpr int32_t kMagicLlama3 = kTokenMagicLlama3, kVersionLlama3 = kTokenVersionLlama3;
constexpr uint64_t kHeaderBytes = kTokenHeaderInts * 4;

int32_t le_i32(const unsigned char* p) { return static_cast<int32_t>(get_u32(p)); }
}  // namespace

TokenHeader check_token_header(const unsigned char* h, uint64_t file_size, const std::string& path) {
  RETRACE_CHECK(file_size >= kHeaderBytes, FormatError, "token shard ", path, " is ", file_size,
                " bytes, shorter than the ", kHeaderBytes,
                "-byte header of an llm.c token file; the file is truncated or not a token file (", kTokenLayout, ")");
  TokenHeader out;
  const int32_t magic = le_i32(h), version = le_i32(h + 4), count = le_i32(h + 8);
  if (magic == kMagicGpt2) {
    RETRACE_CHECK(version == kVersionGpt2, FormatError, "token shard ", path, ": header[1] (version) is ", version,
                  " with the GPT-2 magic ", kMagicGpt2, ", expected ", kVersionGpt2,
                  " (uint16 tokens); the header is damaged or from an unknown writer");
    out.width = 2;
  } else if (magic == kMagicLlama3) {
    RETRACE_CHECK(version == kVersionLlama3, FormatError, "token shard ", path, ": header[1] (version) is ", version,
                  " with the LLaMA-3 magic ", kMagicLlama3, ", expected ", kVersionLlama3,
                  " (uint32 tokens); the header is damaged or from an unknown writer");
    out.width = 4;
  } else {
    RETRACE_FAIL(FormatError, "token shard ", path, ": header[0] (magic) is ", magic, ", expected ", kMagicGpt2,
                 " (GPT-2, uint16 tokens) or ", kMagicLlama3,
                 " (LLaMA-3, uint32 tokens); this is not an llm.c token file (", kTokenLayout, ")");
  }
  RETRACE_CHECK(count >= 0, FormatError, "token shard ", path, ": header[2] (token count) is ", count,
                ", expected a count >= 0; the header is damaged");
  const uint64_t expected = kHeaderBytes + uint64_t{out.width} * static_cast<uint64_t>(count);
  RETRACE_CHECK(file_size == expected, FormatError, "token shard ", path, ": header[2] says ", count, " tokens of ",
                out.width, " bytes, which need ", expected, " bytes, but the file has ", file_size, " bytes (room for ",
                (file_size - kHeaderBytes) / out.width, " tokens); the file is ",
                file_size < expected ? "truncated" : "longer than its header says");
  RETRACE_CHECK(count > 0, FormatError, "token shard ", path,
                " holds no tokens (header[2] is 0); remove it from the data directory or write it again");
  out.tokens = static_cast<uint64_t>(count);
  return out;
}

}  // namespace retrace::data
