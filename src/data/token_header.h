// The header of an llm.c token file, checked against the file's size: the part of the token-file
// reader (token_files.h) that reads what a file says about itself, apart from torch and the file
// system, so that a fuzzer can run it on any bytes (tools/fuzz/token_fuzzer.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace retrace::data {

inline constexpr int32_t kTokenMagicGpt2 = 20240520;
inline constexpr int32_t kTokenVersionGpt2 = 1;  // uint16 tokens
inline constexpr int32_t kTokenMagicLlama3 = 20240801;
inline constexpr int32_t kTokenVersionLlama3 = 7;  // uint32 tokens
inline constexpr int64_t kTokenHeaderInts = 256;

inline constexpr const char* kTokenLayout =
    "expected a directory of llm.c token files: training shards named *train*.bin and validation shards "
    "named *val*.bin (e.g. fineweb_train_000001.bin, or train.bin and val.bin), each a header of 256 "
    "little-endian int32 (magic 20240520, version 1, token count: uint16 tokens; or 20240801, 7: uint32 "
    "tokens) followed by the tokens; llm.c's dev/data scripts write them, tools/data/write_tokens.py writes "
    "one from a text file";

struct TokenHeader {
  uint32_t width = 2;   // bytes per token: 2 (GPT-2 format) or 4 (LLaMA-3)
  uint64_t tokens = 0;  // at least 1
};

// `bytes` holds the file's first min(file_size, 1024) bytes. FormatError naming `path` for a file
// shorter than the header, a wrong magic or version, a negative token count, a count that does not
// match the size (expected and found values), and zero tokens. The tokens are then bytes
// [1024, 1024 + width * tokens), the rest of the file.
TokenHeader check_token_header(const unsigned char* bytes, uint64_t file_size, const std::string& path);

}  // namespace retrace::data
