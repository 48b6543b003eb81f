// A pre-tokenized language-model data set in llm.c's token file format: a directory holding
//
//   DIR/train.bin   the training tokens
//   DIR/val.bin     the validation tokens (the trainer's test split)
//
// Each file (all integers little-endian):
//   [0, 1024)        header: 256 int32; header[0] = 20240520 (magic), header[1] = 1 (version:
//                    uint16 tokens), header[2] = T, the number of tokens; the rest is ignored
//   [1024, 1024+2T)  T uint16 token ids; the file ends there
// (llm.c's dev/data scripts write this format; tools/data/write_tokens.py writes byte-level
// tokens from a text file. Version 2, uint32 tokens, is not read.)
//
// Each file's tokens are cut into non-overlapping windows of context + 1 tokens from its start,
// a shorter tail is dropped; inputs are window[:-1] and targets window[1:], both int64
// [windows, context], in file order, as in text_corpus.h.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"

namespace retrace::data {

inline constexpr const char* kTokenTrainFile = "train.bin";
inline constexpr const char* kTokenValFile = "val.bin";
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenHeaderInts = 256;

// Reads DIR/train.bin (train split) and DIR/val.bin (test split). vocab_size 0 takes the largest
// token of both files + 1; otherwise every token must be < vocab_size. Throws
//   IoError      DIR missing or not a directory; a file missing (the message names it and the
//                expected layout) or unreadable;
//   FormatError  a file shorter than its header, a wrong magic or version, a token count that is
//                negative or does not match the file size (expected and found values);
//   ConfigError  context < 1, vocab_size < 0, a token >= vocab_size (file, position and token), a
//                file with fewer than context + 1 tokens (how many tokens, and the context).
// files: both files with size and sha256 (computed while reading, one pass).
Dataset load_token_files(const std::string& dir, int64_t context, int64_t vocab_size);

}  // namespace retrace::data
