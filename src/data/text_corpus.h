// A byte-level text corpus for the GPT: one file, or every text file under a directory,
// concatenated and cut into fixed-length windows of token ids.
//
// Deterministic: the same files give the same tensors on every machine. Files under a directory
// are taken recursively in sorted path order (byte-wise comparison of the path strings); symbolic
// links to files are followed, but a target reached by several paths is read once, at its first
// path in that order (links to directories are not followed). A file that holds a NUL byte is
// treated as binary and skipped. Files are joined with one '\n' between them.
//
// Tokens: the vocabulary is the sorted set of bytes present; a token is the index of its byte in
// the vocabulary. The token stream is cut into non-overlapping windows of context + 1 tokens
// (a tail shorter than that is dropped); inputs are window[:-1], targets window[1:]. The last
// floor(windows * test_fraction) windows (at least one when test_fraction > 0) form the test
// split, the rest the training split; both keep the corpus order.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "records/records.h"

namespace retrace::data {

inline constexpr const char* kDefaultTextCorpus = "/usr/share/common-licenses";

struct TextCorpus {
  torch::Tensor train_inputs;   // int64 [N_train, context]
  torch::Tensor train_targets;  // int64 [N_train, context], inputs shifted left by one
  torch::Tensor test_inputs;    // int64 [N_test, context]
  torch::Tensor test_targets;   // int64 [N_test, context]
  int64_t vocab_size = 0;
  std::vector<uint8_t> vocab;            // vocab[token] = byte, ascending
  int64_t characters = 0;                // bytes in the joined text, separators included
  std::vector<records::FileInfo> files;  // the files read, in order, with size and sha256
};

// Throws IoError naming `path_or_dir` when it does not exist or a file cannot be read, and
// ConfigError for context < 1, test_fraction outside [0, 1), an empty corpus or fewer than two
// windows (the message says how many characters were found and the context asked).
TextCorpus load_text_corpus(const std::string& path_or_dir, int64_t context, double test_fraction);

// The bytes of a 1-D tensor of tokens, as a string. Throws ConfigError for a token outside the
// vocabulary.
std::string decode(const TextCorpus& corpus, const torch::Tensor& tokens);

}  // namespace retrace::data
