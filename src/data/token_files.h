// A pre-tokenized language-model data set in llm.c's token file format, as shards: a directory
// holding
//
//   DIR/*train*.bin   the training shards (e.g. fineweb_train_000001.bin, or train.bin)
//   DIR/*val*.bin     the validation shards (the trainer's test split)
//
// each kind taken in name order (byte-wise comparison of the file names). A name that matches
// both is refused. Each file (all integers little-endian):
//   [0, 1024)         header: 256 int32; header[0] magic, header[1] version, header[2] = T, the
//                     number of tokens; the rest is ignored
//   [1024, 1024+wT)   T token ids of w bytes each; the file ends there
// Two formats, as llm.c's dev/data scripts write them:
//   GPT-2     magic 20240520, version 1, uint16 tokens (w = 2)
//   LLaMA-3   magic 20240801, version 7, uint32 tokens (w = 4)
// All shards of a data set have one format: a mix means two tokenizers' outputs were put in one
// directory, which no vocabulary fits, and is refused. tools/data/write_tokens.py writes
// byte-level GPT-2-format files from a text file.
//
// Windows: each shard's tokens are cut into non-overlapping windows of context + 1 tokens from its
// start; a shorter tail (at most `context` tokens) is dropped. A window never crosses a shard
// boundary. Inputs are window[:-1] and targets window[1:], int64 [context] each. The split's
// windows are numbered shard by shard in shard order; window i lies in the shard whose prefix sum
// of window counts passes i (a binary search over one integer per shard).
//
// Memory: the shards are memory-mapped read-only; a batch reads only its windows. What is held in
// anonymous memory is one record per shard, whatever the data's size.
#pragma once

#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "data/token_header.h"

namespace retrace::data {

// Reads DIR's shards (train split from *train*.bin, test split from *val*.bin): each is mapped,
// its header checked, and its bytes hashed (sha256) and its tokens checked against the vocabulary
// in one pass over the file. vocab_size 0 takes the largest token of all shards + 1; otherwise
// every token must be < vocab_size. Throws
//   IoError      DIR missing or not a directory; no train shard or no val shard (the message names
//                the layout); a shard that is a directory, a dangling link, or cannot be opened,
//                mapped or read;
//   FormatError  a shard shorter than its header, a wrong magic or version, a token count that is
//                negative or does not match the file size (expected and found values), zero tokens;
//   ConfigError  context < 1, vocab_size < 0, a token >= vocab_size (file, position and token), a
//                shard with fewer than context + 1 tokens, shards of both formats, a name that
//                matches both *train* and *val*.
// files: every shard with size and sha256, train shards first.
Dataset load_token_files(const std::string& dir, int64_t context, int64_t vocab_size);

}  // namespace retrace::data
